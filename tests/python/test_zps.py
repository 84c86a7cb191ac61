"""zps (python/zps/__init__.py): the library's data order, versions and
errors, without torch."""
import time

import pytest

import zps


def test_version_is_the_headers_major():
    assert zps.version()[0] == 1


def test_batch_indices_of_a_step_are_its_pieces_joined():
    whole = zps.batch_indices(1000, 64, seed=3, step=5)
    assert len(whole) == 64 and len(set(whole)) == 64
    assert zps.batch_indices(1000, 64, 3, 5, offset=0, count=20) + \
        zps.batch_indices(1000, 64, 3, 5, offset=20, count=44) == whole


def test_batch_indices_of_an_epoch_are_a_permutation():
    steps = 1000 // 100
    seen = [i for t in range(steps) for i in zps.batch_indices(1000, 100, seed=1, step=t)]
    assert sorted(seen) == list(range(1000))
    assert zps.batch_indices(1000, 100, 1, 0) != zps.batch_indices(1000, 100, 1, steps)


def test_batch_indices_refuses_a_batch_larger_than_the_data():
    with pytest.raises(zps.BadArgument):
        zps.batch_indices(10, 64, 0, 0)


def test_unknown_option_is_a_bad_argument():
    c = zps.Client("tcp://127.0.0.1:1")
    with pytest.raises(zps.BadArgument, match="no option"):
        c.set("colour", 3)
    with pytest.raises(zps.BadArgument):
        c.set("timeout_ms", -5)
    c.close()


def test_malformed_endpoint_is_a_transport_error_at_once():
    c = zps.Client("tcp://no port here")
    t = time.monotonic()
    with pytest.raises(zps.TransportError):
        c.connect()
    assert time.monotonic() - t < 5
    c.close()


def test_no_server_at_the_address_times_out_within_the_join_timeout():
    c = zps.Client("tcp://127.0.0.1:9")  # the discard port: nothing listens
    c.set("join_timeout_ms", 1500)
    c.connect()
    t = time.monotonic()
    with pytest.raises(zps.TimedOut, match="gave up after"):
        c.join()
    assert time.monotonic() - t < 10
    c.close()


def test_log_level_takes_known_names_only():
    zps.set_log_level("warn")
    zps.set_log_level("info")
    with pytest.raises(zps.BadArgument):
        zps.set_log_level("loud")


def test_the_work_structure_is_the_headers_layout(tmp_path):
    """_lib.Work against struct zps_work as the C compiler lays it out."""
    import ctypes
    import os
    import shutil
    import subprocess

    from zps import _lib
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to read include/zps.h's layout with")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    names = [name for name, _ in _lib.Work._fields_]
    src = tmp_path / "layout.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "zps.h"\nint main(void)\n'
                   '{\n    printf("size %zu\\n", sizeof(zps_work));\n' +
                   "".join(f'    printf("{n} %zu %zu\\n", offsetof(zps_work, {n}), '
                           f'sizeof(((zps_work *)0)->{n}));\n' for n in names) +
                   "    return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", os.path.join(root, "include"), "-o", str(exe), str(src)],
                   check=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                         timeout=10).stdout.split("\n")
    assert out[0] == f"size {ctypes.sizeof(_lib.Work)}"
    for line, name in zip(out[1:], names):
        field = getattr(_lib.Work, name)
        assert line == f"{name} {field.offset} {field.size}"


def test_the_job_information_keys_are_the_headers():
    """_lib's INFO_* against enum zps_info of include/zps.h (1, 2, ... in order)."""
    import os
    import re

    from zps import _lib
    header = open(os.path.join(os.path.dirname(__file__), "..", "..", "include", "zps.h")).read()
    body = re.search(r"typedef enum zps_info \{(.*?)\} zps_info;", header, re.S).group(1)
    keys = re.findall(r"^\s*ZPS_INFO_(\w+)", body, re.M)
    assert [getattr(_lib, "INFO_" + k) for k in keys] == list(range(1, len(keys) + 1))
    assert "INNER_STEPS" in keys
    assert (_lib.MODE_SYNC, _lib.MODE_DILOCO) == (0, 1)
    assert _lib.has("zps_inner_done")
