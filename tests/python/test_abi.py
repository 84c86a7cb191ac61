"""test_abi.py - the Python package against include/zps.h, its one source.

_lib mirrors the header by hand (ctypes, ABI mode: nothing is compiled
when the package is imported). These tests read the header's text for
what it names (every enum constant, struct zps_work's fields in order,
every function) and ask the C compiler for what those names are worth
(values, offsets, sizes), then hold _lib and the exception table of
zps/__init__.py against both, in both directions: a code, key, field or
call added to the header without its Python mirror fails here, and so
does a Python constant the header does not have.
"""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

import zps
from zps import _lib

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADER = os.path.join(ROOT, "include", "zps.h")

# Calls of the header the package does not bind, each with its reason.
NOT_BOUND = {
    "zps_set_log_hook": "libzps logs to stderr, as the daemons do; a C callback "
                        "into Python would run on the heartbeat thread",
}


def _header_text():
    """include/zps.h without its comments (the usage example is C too)."""
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _header_enums():
    """[(enum name, or "" when anonymous, [ZPS_... in order]), ...]."""
    enums = []
    for name, body in re.findall(r"\benum\s*(\w*)\s*\{(.*?)\}", _header_text(), re.S):
        consts = [m.group(1) for item in body.split(",")
                  for m in [re.match(r"\s*(ZPS_\w+)", item)] if m]
        enums.append((name, consts))
    return enums


def _header_work_fields():
    """struct zps_work's field names, in the header's order."""
    body = re.search(r"typedef struct zps_work \{(.*?)\} zps_work;", _header_text(),
                     re.S).group(1)
    names = []
    for decl in body.split(";"):
        for declarator in decl.split(",") if decl.strip() else []:
            names.append(re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", declarator).group(1))
    return names


def _header_functions():
    return set(re.findall(r"^[\w ]*?[\w*][\s*]+(zps_\w+)\(", _header_text(), re.M))


def _lib_constants():
    """_lib's mirrored constants: its public upper-case ints but SO_MAJOR."""
    return {k: v for k, v in vars(_lib).items()
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", k) and type(v) is int and k != "SO_MAJOR"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """What the C compiler makes of the header's names: {name: int}, with
    "size" and "<field>.offset" / "<field>.size" of zps_work."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to read include/zps.h with")
    consts = [c for _, names in _header_enums() for c in names] + ["ZPS_VERSION_MAJOR"]
    fields = _header_work_fields()
    lines = [f'    printf("{c} %lld\\n", (long long){c});' for c in consts]
    lines.append('    printf("size %zu\\n", sizeof(zps_work));')
    lines += [f'    printf("{f}.offset %zu\\n{f}.size %zu\\n", offsetof(zps_work, {f}), '
              f'sizeof(((zps_work *)0)->{f}));' for f in fields]
    tmp = tmp_path_factory.mktemp("abi")
    src, exe = tmp / "abi.c", tmp / "abi"
    src.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "zps.h"\n'
                   "int main(void)\n{\n" + "\n".join(lines) + "\n    return 0;\n}\n")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"),
                    "-o", str(exe), str(src)], check=True, timeout=60)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=10)
    return {k: int(v) for k, v in (line.split() for line in out.stdout.splitlines())}


def test_the_header_is_read_whole():
    """The reading below finds what the header is known to hold, so a
    reading that finds nothing cannot pass for agreement."""
    enums = dict(_header_enums())
    assert enums["zps_err"][0] == "ZPS_OK" and enums["zps_err"][-1] == "ZPS_ECOUNT_"
    assert "ZPS_EPERM" in enums["zps_err"] and "ZPS_EAGAIN" in enums["zps_err"]
    assert {"zps_next", "zps_opt", "zps_info", "zps_work_kind"} <= set(enums)
    assert _header_work_fields()[:3] == ["kind", "id", "step"]
    assert {"zps_strerror", "zps_next_work", "zps_leave"} <= _header_functions()


def test_every_constant_of_the_header_is_in_lib_with_its_value(compiled):
    """ZPS_X is _lib.X, with the compiler's value; _lib has nothing more."""
    header = {c[len("ZPS_"):]: compiled[c] for _, names in _header_enums() for c in names}
    mirrored = _lib_constants()
    assert sorted(set(header) - set(mirrored)) == [], "in include/zps.h, not in _lib"
    assert sorted(set(mirrored) - set(header)) == [], "in _lib, not in include/zps.h"
    assert {k: mirrored[k] for k in header} == header


def test_the_library_major_is_the_headers(compiled):
    assert _lib.SO_MAJOR == compiled["ZPS_VERSION_MAJOR"]


def test_the_work_structure_is_the_headers_layout(compiled):
    """_lib.Work's fields: the header's names in its order, each at the
    compiler's offset with its size, and the whole of the compiler's size."""
    assert [name for name, _ in _lib.Work._fields_] == _header_work_fields()
    assert ctypes.sizeof(_lib.Work) == compiled["size"]
    for name, _ in _lib.Work._fields_:
        field = getattr(_lib.Work, name)
        assert (name, field.offset, field.size) == \
            (name, compiled[name + ".offset"], compiled[name + ".size"])


def test_every_call_of_the_header_is_bound():
    bound = set(_lib._SIGNATURES)
    assert sorted(_header_functions() - bound - set(NOT_BOUND)) == [], "not bound in _lib"
    assert sorted(bound - _header_functions()) == [], "bound, but not in include/zps.h"
    assert all(_lib.has(name) for name in _lib._SINCE), "this tree's libzps lacks a call"


def test_every_error_code_raises_its_own_class_or_is_plain_on_purpose():
    """A new code fails here until zps/__init__.py says what it raises."""
    codes = set(range(_lib.OK + 1, _lib.ECOUNT_))
    classed, plain = set(zps._BY_CODE), set(zps._PLAIN)
    assert classed & plain == set()
    assert classed | plain == codes
    for code in codes:
        e = zps.error(code, "")
        assert type(e) is zps._BY_CODE.get(code, zps.ZpsError) and e.code == code
        assert str(e) == zps.lib.zps_strerror(code).decode() != "unknown error"


def test_a_refusal_by_role_is_refused_and_not_yet_is_not_yet():
    assert isinstance(zps.error(_lib.EPERM, "initial values come from rank 0"), zps.Refused)
    not_yet = zps.error(_lib.EAGAIN, "")
    assert isinstance(not_yet, zps.NotYet) and not isinstance(not_yet, zps.Refused)
    assert str(not_yet) == "not yet"
