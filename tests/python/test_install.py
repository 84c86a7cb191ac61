"""pip install ./python (docs/pytorch.md, Install), offline, as on a fresh
Debian 12: a venv that sees Debian's torch (--system-site-packages), pip's
build with Debian's setuptools (--no-build-isolation --no-index), then the
installed package imported with a clean environment. And the order in
which zps/_lib.py looks for libzps.so.1, with the one line it raises when
none is found.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from zps import _lib

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIB = os.environ.get("ZPS_LIB", os.path.join(ROOT, "bin", _lib.SONAME))
TIMEOUT = 120  # s, each subprocess; pip install takes a few


def header_version():
    with open(os.path.join(ROOT, "include", "zps.h")) as f:
        h = f.read()
    return tuple(int(re.search(rf"#define ZPS_VERSION_{p} (\d+)", h).group(1))
                 for p in ("MAJOR", "MINOR", "PATCH"))


def run(argv, env, cwd):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT)


def clean_env(tmp, **extra):
    """No PYTHONPATH, no ZPS_LIB, a HOME with nothing installed under it."""
    home = os.path.join(tmp, "home")
    os.makedirs(home, exist_ok=True)
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """(venv, its site-packages' zps, tmp): python/ installed by pip."""
    tmp = str(tmp_path_factory.mktemp("install"))
    env = clean_env(tmp)
    venv = os.path.join(tmp, "venv")
    r = run([sys.executable, "-m", "venv", "--system-site-packages", venv], env, tmp)
    if r.returncode != 0:  # Debian's python3 without python3-venv: no ensurepip
        pytest.skip(f"{sys.executable} -m venv failed (python3-venv missing?): "
                    + " ".join((r.stdout + r.stderr).split())[-300:])
    pip = os.path.join(venv, "bin", "pip")
    if not os.path.exists(pip):
        pytest.skip(f"no pip in a venv of {sys.executable} (python3-venv, python3-pip missing?)")
    # A copy of python/, so that pip's build/ and zps.egg-info stay out of the tree.
    shutil.copytree(os.path.join(ROOT, "python"), os.path.join(tmp, "python"),
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = run([pip, "install", "--no-build-isolation", "--no-index", "--no-cache-dir",
             "--disable-pip-version-check", "-q", "./python"], env, tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([os.path.join(venv, "bin", "python"), "-c",
             "import importlib.util, os; "
             "print(os.path.dirname(importlib.util.find_spec('zps').origin))"], env, tmp)
    assert r.returncode == 0, r.stderr
    pkg = r.stdout.strip()
    assert pkg.startswith(venv + os.sep), pkg
    return venv, pkg, tmp


def probe(venv, env, tmp, code):
    """Runs code in the venv's python, the installed zps; its JSON line."""
    r = run([os.path.join(venv, "bin", "python"), "-c",
             "import json, importlib.metadata, zps; " + code], env, tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_pip_install_imports_zps_and_zps_torch_with_zps_lib(venv):
    venv, pkg, tmp = venv
    env = clean_env(tmp, ZPS_LIB=LIB)
    got = probe(venv, env, tmp, "import zps.torch; print(json.dumps([zps.__file__, "
                "zps._lib.lib_path, zps.version(), importlib.metadata.version('zps')]))")
    assert got[0] == os.path.join(pkg, "__init__.py")
    assert got[1] == LIB
    want = header_version()
    assert tuple(got[2]) == want, "the library is not this tree's"
    assert got[3] == "%d.%d.%d" % want, "python/pyproject.toml's version is not include/zps.h's"
    assert os.access(os.path.join(venv, "bin", "zps-run"), os.X_OK)  # the console script


def test_pip_install_finds_a_libzps_beside_the_package(venv):
    venv, pkg, tmp = venv
    beside = os.path.join(pkg, _lib.SONAME)
    shutil.copy(LIB, beside)
    try:
        got = probe(venv, clean_env(tmp), tmp, "print(json.dumps(zps._lib.lib_path))")
    finally:
        os.unlink(beside)
    assert got == beside


def test_pip_install_without_libzps_says_where_it_looked(venv):
    venv, pkg, tmp = venv
    prefixes = _lib.install_prefixes()[:1] + [os.path.join(tmp, "home", ".local"), venv]
    if any(os.path.exists(os.path.join(p, "lib", _lib.SONAME)) for p in prefixes):
        pytest.skip(f"a libzps is installed in one of {prefixes}")
    env = clean_env(tmp)
    r = run([os.path.join(venv, "bin", "python"), "-c", "import zps"], env, tmp)
    if r.returncode == 0:
        pytest.skip(f"{_lib.SONAME} is on this machine's loader path")
    last = r.stderr.strip().splitlines()[-1]
    want = (f"ImportError: {_lib.SONAME} not found: ZPS_LIB unset; not beside {pkg}; "
            + "; ".join(f"not in {p}/lib" for p in prefixes)
            + "; not on the loader's path. Run make install, or set ZPS_LIB to a libzps.so.1")
    assert last == want


# find_library itself, with directories of this test: no subprocess, no
# dependence on what this machine has installed (a soname no one has).
SONAME = "libzps-test.so.1"


@pytest.fixture
def places(tmp_path):
    """A source tree with the package, a make install prefix, all empty."""
    tree = tmp_path / "tree"
    here = tree / "python" / "zps"
    here.mkdir(parents=True)
    (tree / "include").mkdir()
    (tree / "include" / "zps.h").write_text("")
    (tree / "bin").mkdir()
    prefix = tmp_path / "prefix"
    (prefix / "lib").mkdir(parents=True)
    return str(here), str(tree / "bin"), str(prefix)


def find(here, prefix, environ=None):
    return _lib.find_library(environ or {}, here, [prefix], SONAME)


def test_none_found_is_one_line_naming_every_place(places):
    here, tree_bin, prefix = places
    with pytest.raises(ImportError) as e:
        find(here, prefix)
    assert str(e.value) == (
        f"{SONAME} not found: ZPS_LIB unset; not beside {here}; not in {tree_bin} (make); "
        f"not in {prefix}/lib; not on the loader's path. "
        "Run make install, or set ZPS_LIB to a libzps.so.1")


def test_first_found_wins_beside_then_tree_then_prefix(places):
    here, tree_bin, prefix = places
    for d in (prefix + "/lib", tree_bin, here):
        shutil.copy(LIB, os.path.join(d, SONAME))
        assert find(here, prefix)[1] == os.path.join(d, SONAME)


def test_zps_lib_set_is_the_only_place_looked_at(places):
    here, tree_bin, prefix = places
    shutil.copy(LIB, os.path.join(here, SONAME))
    missing = os.path.join(prefix, "nope.so.1")
    with pytest.raises(ImportError) as e:
        find(here, prefix, {"ZPS_LIB": missing})
    assert str(e.value) == (f"{SONAME} not found: ZPS_LIB={missing}: no such file. "
                            "Point ZPS_LIB at a libzps.so.1 (make builds bin/libzps.so.1), "
                            "or unset it")
    assert find(here, prefix, {"ZPS_LIB": LIB})[1] == LIB
