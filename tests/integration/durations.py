#!/usr/bin/env python3
"""durations.py - where an integration run's time went, from Check's XML log.

make test and make test-long have check_integration write its results to an
XML file (CK_XML_LOG_FILE_NAME); this prints each suite's time and the
slowest cases, so that a CI log says what to look at when a tier grows.

    python3 tests/integration/durations.py build/tests/integration.xml [N]
"""
import sys
import xml.etree.ElementTree as ET

NS = {"ck": "http://check.sourceforge.net/ns"}


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit("usage: durations.py CHECK_XML [N]")
    slowest = int(argv[2]) if len(argv) == 3 else 5
    try:
        root = ET.parse(argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        sys.exit(f"durations.py: cannot read {argv[1]}: {e}")
    suites, cases = [], []
    for suite in root.findall("ck:suite", NS):
        name = suite.findtext("ck:title", "?", NS)
        total = 0.0
        for test in suite.findall("ck:test", NS):
            seconds = float(test.findtext("ck:duration", "0", NS))
            total += seconds
            cases.append((seconds, f"{name}/{test.findtext('ck:description', '?', NS)}/"
                                   f"{test.findtext('ck:id', '?', NS)}"))
        if total > 0:
            suites.append((total, name))
    print("integration time by suite: " +
          ", ".join(f"{n} {s:.0f} s" for s, n in sorted(suites, reverse=True)))
    print(f"the {slowest} slowest cases:")
    for seconds, name in sorted(cases, reverse=True)[:slowest]:
        print(f"  {seconds:7.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv)
