#!/usr/bin/env python3
"""bench/link_use.py - how busy each emulated host's link is, moment by
moment (deploy/netns-cluster.sh -u FILE samples it during a run).

  link_use.py sample FILE PORT...   (in the hub namespace: netns-cluster.sh)
      every 2 ms, a line of FILE: the time, then for each PORT (a host's
      end of its link on the hub's bridge, named as the host) the bytes it
      received (what the host sent) and sent (what the host received);
      until SIGTERM or SIGINT.
  link_use.py show FILE RATE [--bin-ms 25] [--from S] [--to S]
      each bin of --bin-ms from S to S seconds into the run: every host's
      use of its link, out then in, as a fraction of RATE (1gbit,
      250mbit, ...); then each host's mean use over the whole sample.

A step that waits on something other than the links shows as bins well
under 1 (the tbf shaper lets about 0.95 through, framing counted): the
step's start, its end, a host whose link idles while another's is full.
Only the standard library: it runs where python3 does."""
import signal
import sys
import time


def sample(path, ports):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    files = []
    for p in ports:
        base = "/sys/class/net/%s/statistics/" % p
        files.append((open(base + "rx_bytes"), open(base + "tx_bytes")))
    with open(path, "w") as out:
        out.write("# t " + " ".join("%s_out %s_in" % (p, p) for p in ports) + "\n")
        while not stop:
            vals = []
            try:
                for rx, tx in files:
                    rx.seek(0)
                    tx.seek(0)
                    vals += [rx.read().strip(), tx.read().strip()]
            except OSError:
                break  # the ports are gone: the run's namespaces were removed
            out.write("%.6f %s\n" % (time.time(), " ".join(vals)))
            time.sleep(0.002)


def bits_per_s(rate):
    r = rate.lower()
    for unit, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(unit):
            return float(r[: -len(unit)]) * mult
    return float(r)


def show(path, rate, bin_ms, t_from, t_to):
    rows, names = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                names = [n[: -len("_out")] for n in line.split()[2::2]]
                continue
            v = line.split()
            if len(v) == 1 + 2 * len(names):
                rows.append([float(x) for x in v])
    if len(rows) < 2:
        sys.exit("link_use: %s holds fewer than two samples" % path)
    bytes_per_s = bits_per_s(rate) / 8
    t0, b = rows[0][0], bin_ms / 1000.0
    print("%8s  %s" % ("s", "  ".join("%9s" % (n + " out/in") for n in names)))
    i, t = 0, t0 + t_from
    while t + b <= min(rows[-1][0], t0 + t_to):
        while i + 1 < len(rows) and rows[i + 1][0] <= t:
            i += 1
        j = i
        while j + 1 < len(rows) and rows[j][0] < t + b:
            j += 1
        span = rows[j][0] - rows[i][0]
        if span > 0:
            use = [(rows[j][k] - rows[i][k]) / span / bytes_per_s for k in range(1, len(rows[i]))]
            print("%8.3f  %s" % (t - t0, "  ".join("%4.2f/%4.2f" % (use[2 * h], use[2 * h + 1])
                                                   for h in range(len(names)))))
        t += b
    whole = rows[-1][0] - t0
    print("mean over %.2f s: %s" % (whole, "  ".join(
        "%s %.2f/%.2f" % (n, (rows[-1][1 + 2 * h] - rows[0][1 + 2 * h]) / whole / bytes_per_s,
                          (rows[-1][2 + 2 * h] - rows[0][2 + 2 * h]) / whole / bytes_per_s)
        for h, n in enumerate(names))))


def main(argv):
    if len(argv) >= 3 and argv[0] == "sample":
        sample(argv[1], argv[2:])
        return
    if len(argv) >= 3 and argv[0] == "show":
        opts = {"--bin-ms": 25.0, "--from": 0.0, "--to": float("inf")}
        rest = argv[3:]
        while rest:
            if rest[0] not in opts or len(rest) < 2:
                sys.exit(__doc__)
            opts[rest[0]] = float(rest[1])
            rest = rest[2:]
        show(argv[1], argv[2], opts["--bin-ms"], opts["--from"], opts["--to"])
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
