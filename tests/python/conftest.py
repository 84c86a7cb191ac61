"""Fixtures of the Python tests: real zps-server and worker processes on
loopback, each wait bounded, each process killed by its pid at the end.

The binaries come from $ZPS_BIN_DIR (make test sets it) or bin/ of this
tree; the package from python/ (PYTHONPATH=python, as docs/pytorch.md says).
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("ZPS_BIN_DIR", os.path.join(ROOT, "bin"))
EXAMPLE = os.path.join(ROOT, "examples", "torch_fmnist.py")
PYTHON = sys.executable


def pytest_configure(config):
    # make test runs -m "not long", make test-long -m long (docs/tests.md).
    config.addinivalue_line("markers", "long: minutes; make test-long runs it, make test not")


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python")
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


class Procs:
    """Processes of one test, logs in its directory, killed at teardown."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []

    def start(self, name, argv):
        log = open(os.path.join(self.tmp, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env())
        p.name, p.log_path = name, log.name
        log.close()
        self.procs.append(p)
        return p

    def log(self, p):
        with open(p.log_path, errors="replace") as f:
            return f.read()

    def server(self, *args, name="server"):
        """zps-server on a free loopback port; its endpoint once it listens."""
        ep_file = os.path.join(self.tmp, name + ".endpoint")
        p = self.start(name, [os.path.join(BIN, "zps-server"), "--listen", "tcp://127.0.0.1:*",
                              "--endpoint-file", ep_file, *args])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.exists(ep_file) and os.path.getsize(ep_file) > 0:
                with open(ep_file) as f:
                    p.endpoint = f.read().strip()
                return p
            if p.poll() is not None:
                pytest.fail(f"{name} exited {p.returncode}:\n{self.log(p)}")
            time.sleep(0.05)
        pytest.fail(f"{name} did not listen within 10 s:\n{self.log(p)}")

    def torch_worker(self, name, endpoint, *args):
        return self.start(name, [PYTHON, EXAMPLE, "--coordinator", endpoint,
                                 "--timeout", "20", "--join-timeout", "60", *args])

    def wait(self, p, timeout=120):
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{p.name} still running after {timeout} s:\n{self.log(p)}")

    def ok(self, p, timeout=120):
        rc = self.wait(p, timeout)
        assert rc == 0, f"{p.name} exited {rc}:\n{self.log(p)}"

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


@pytest.fixture
def procs():
    with tempfile.TemporaryDirectory(prefix="zps-py-") as tmp:
        ps = Procs(tmp)
        try:
            yield ps
        finally:
            ps.kill_all()


def single(procs, name, *args, timeout=120):
    """examples/torch_fmnist.py --single: the one-process reference."""
    out = os.path.join(procs.tmp, name + ".params")
    p = procs.start(name, [PYTHON, EXAMPLE, "--single", "--save", out, *args])
    procs.ok(p, timeout)
    return np.fromfile(out, dtype=np.float32)


def params(procs, name):
    return np.fromfile(os.path.join(procs.tmp, name + ".params"), dtype=np.float32)


def save_arg(procs, name):
    return ["--save", os.path.join(procs.tmp, name + ".params")]
