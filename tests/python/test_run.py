"""zps-run (python -m zps.run): a server and N copies of a script on this
host, their lines prefixed, the first failure or a signal stopping all of
them, no process left behind."""
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import BIN, EXAMPLE, PYTHON, env

# Rank hint 1 fails at once; the others would sleep a minute, the server
# waits for a job that never starts.
FAIL_ON_1 = ("import os, sys, time; r = os.environ['ZPS_RANK_HINT']; "
             "print('hint', r, 'of', os.environ['ZPS_WORKERS'], os.environ['ZPS_COORDINATOR'], "
             "os.environ.get('ZPS_SHARE'), flush=True); "
             "sys.exit(3) if r == '1' else time.sleep(60)")
SLEEP = "import time; print('up', flush=True); time.sleep(60)"


def zps_run(tmp, *args):
    """zps-run in a process group of its own, its output in a file, the
    pids of its children in another."""
    e = env()
    e["ZPS_RUN_PID_FILE"] = os.path.join(tmp, "pids")
    out = open(os.path.join(tmp, "out"), "wb")
    p = subprocess.Popen([PYTHON, "-m", "zps.run", *args], stdout=out, stderr=subprocess.STDOUT,
                         env=e, start_new_session=True)
    out.close()
    return p


def output(tmp):
    with open(os.path.join(tmp, "out"), errors="replace") as f:
        return f.read()


def finish(p, tmp, timeout):
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        raise AssertionError(f"zps-run still running after {timeout} s:\n{output(tmp)}")


def children(tmp, n):
    """The children's pids once zps-run has written them (all started)."""
    path = os.path.join(tmp, "pids")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                pids = [int(x) for x in f.read().split()]
            if len(pids) == n:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"zps-run wrote no {n} pids in 30 s:\n{output(tmp)}")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_all_gone(pids, tmp):
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)  # not to leave them to the next test
    assert not left, f"children {left} outlived zps-run:\n{output(tmp)}"


def test_two_torch_workers_end_with_the_same_bits_and_prefixed_lines(tmp_path):
    save = os.path.join(tmp_path, "w{rank}.params")
    p = zps_run(tmp_path, "--workers", "2", "--steps", "30", "--global-batch", "64",
                "--lr-schedule", "constant", "--", PYTHON, EXAMPLE, "--test-size", "0",
                "--timeout", "20", "--join-timeout", "60", "--save", save)
    assert finish(p, tmp_path, 120) == 0, output(tmp_path)
    w0 = np.fromfile(os.path.join(tmp_path, "w0.params"), dtype=np.float32)
    w1 = np.fromfile(os.path.join(tmp_path, "w1.params"), dtype=np.float32)
    assert w0.size == 54314 and np.array_equal(w0, w1)
    out = output(tmp_path)
    lines = out.splitlines()
    assert all(line.startswith(("server: ", "worker 0: ", "worker 1: ", "zps-run: "))
               for line in lines), out
    for rank in (0, 1):
        assert any(line.startswith(f"worker {rank}: worker rank ") and line.endswith("done")
                   for line in lines), out
    assert "server: " in out and "trained 30 steps" in out
    assert_all_gone(children(tmp_path, 3), tmp_path)


def test_a_failing_worker_stops_the_job_with_its_status(tmp_path):
    start = time.monotonic()
    p = zps_run(tmp_path, "--workers", "3", "--share", "8", "--stop-timeout", "5", "--",
                PYTHON, "-c", FAIL_ON_1)
    pids = children(tmp_path, 4)
    assert finish(p, tmp_path, 60) == 3
    assert time.monotonic() - start < 30
    out = output(tmp_path)
    assert "worker 1: hint 1 of 3 tcp://127.0.0.1:" in out and " 8\n" in out, out
    assert "zps-run: worker 1 (pid " in out and "exited 3; stopping the others" in out, out
    assert_all_gone(pids, tmp_path)


def test_ctrl_c_goes_to_every_child(tmp_path):
    p = zps_run(tmp_path, "--workers", "2", "--", PYTHON, "-c", SLEEP)
    pids = children(tmp_path, 3)
    deadline = time.monotonic() + 30
    while output(tmp_path).count(": up") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGINT)
    assert finish(p, tmp_path, 30) == 130
    out = output(tmp_path)
    assert "zps-run: SIGINT: passing it to every child" in out
    assert "worker 0: KeyboardInterrupt" in out and "worker 1: KeyboardInterrupt" in out, out
    assert_all_gone(pids, tmp_path)


def test_bad_command_lines_say_what_to_do():
    def run(*args):
        r = subprocess.run([PYTHON, "-m", "zps.run", *args], env=env(), capture_output=True,
                           text=True, timeout=30)
        return r.returncode, r.stderr

    rc, err = run("--workers", "2", "python3", "train.py")
    assert rc == 2 and "give the training command after --" in err
    rc, err = run("--coordinator", "tcp://h:5555", "--workers", "2", "--steps", "9", "--",
                  "true")
    assert rc == 2 and "--coordinator starts no server: --steps 9 would go to one" in err


def test_workers_only_join_a_coordinator(tmp_path):
    """--coordinator: no server; a C zps-worker reads ZPS_COORDINATOR too."""
    p = zps_run(tmp_path, "--coordinator", "tcp://127.0.0.1:9", "--workers", "2",
                "--rank-offset", "4", "--", PYTHON, "-c",
                "import os; print(os.environ['ZPS_RANK_HINT'], os.environ['ZPS_COORDINATOR'])")
    assert finish(p, tmp_path, 30) == 0
    out = output(tmp_path)
    assert "worker 4: 4 tcp://127.0.0.1:9" in out and "worker 5: 5 tcp://127.0.0.1:9" in out
    assert "server" not in out


def test_run_of_none_takes_the_coordinator_share_and_keys_from_the_environment(monkeypatch):
    import torch

    import zps
    import zps.torch as zt

    for k in ("ZPS_COORDINATOR", "ZPS_SHARE", "ZPS_CURVE_SECRET", "ZPS_SERVER_KEY"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(zps.BadArgument, match="set ZPS_COORDINATOR, or start the script "
                                              "under zps-run"):
        zt.Run(None, torch.nn.Linear(2, 1), dataset_size=10)
    monkeypatch.setenv("ZPS_COORDINATOR", "tcp://h:1")
    monkeypatch.setenv("ZPS_SHARE", "8")
    monkeypatch.setenv("ZPS_CURVE_SECRET", "w.key")
    monkeypatch.setenv("ZPS_SERVER_KEY", "s.pub")
    assert zt._from_environment(None, None, None) == ("tcp://h:1", 8, ("w.key", "s.pub"))
    assert zt._from_environment(None, 4, ("a", "b")) == ("tcp://h:1", 4, ("a", "b"))
    assert zt._from_environment("tcp://x:2", None, None) == ("tcp://x:2", None, None)
    monkeypatch.setenv("ZPS_SHARE", "lots")
    with pytest.raises(zps.BadArgument, match="ZPS_SHARE='lots': a number of samples"):
        zt._from_environment(None, None, None)


def test_two_hosts_one_zps_run_starting_the_server_the_other_joining_it(tmp_path):
    """--job-workers and --listen on the first, --coordinator on the
    second: C workers of the built-in MLP (ZPS_COORDINATOR is zps-worker's
    --coordinator), 5 steps."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    worker = [os.path.join(BIN, "zps-worker")]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    a = zps_run(first, "--workers", "1", "--job-workers", "2", "--listen", endpoint, "--model",
                "mlp:784-64-10", "--steps", "5", "--", *worker)
    b = zps_run(second, "--coordinator", endpoint, "--workers", "1", "--rank-offset", "1", "--",
                *worker)
    assert finish(a, first, 60) == 0, output(first)
    assert finish(b, second, 60) == 0, output(second)
    assert "server: " in output(first) and "admitted as rank 1 (2 of 2)" in output(first)
    assert "worker 1: " in output(second) and "done: 5 steps" in output(second)


def test_no_zps_server_says_where_it_looked(tmp_path):
    import shutil
    shutil.copytree(os.path.join(os.path.dirname(EXAMPLE), "..", "python", "zps"),
                    tmp_path / "pkg" / "zps")  # outside the tree: no bin/ beside it
    e = env()
    e.update(PYTHONPATH=str(tmp_path / "pkg"), ZPS_BIN_DIR=str(tmp_path / "nobin"),
             PATH="/usr/bin:/bin")
    e.setdefault("ZPS_LIB", os.path.join(BIN, "libzps.so.1"))  # the package's import loads it
    r = subprocess.run([PYTHON, "-m", "zps.run", "--workers", "1", "--", "true"], env=e,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"zps-run: no zps-server in {tmp_path / 'nobin' / 'zps-server'}, "), r.stderr
    assert lines[0].endswith("or PATH (HINT: make, then set ZPS_BIN_DIR to its bin/)")
