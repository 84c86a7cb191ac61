"""test_groups.py - the user's optimizer on the shards (libzps 1.4): a
worker declares parameter groups, a buffer and a learning-rate table; a
server started with optimizer flags that differ refuses the declaration
with one line naming the difference, and one started without them trains
each tensor with its own group's rates (docs/optimizers.md).

No torch: the worker is the bare Client over numpy buffers.
"""
import time

import numpy as np
import pytest

import zps
from conftest import BIN
from zps import _lib

N = 64  # train records
STEPS = 3


def job(procs, *args, name="server", steps=STEPS):
    workers = [] if "--workers" in args else ["--workers", "1"]
    return procs.server("--model", "external", "--global-batch", "16", "--steps", str(steps),
                        *workers, *args, name=name)


LR = np.array([[0.1, 0.0], [0.2, 0.5], [0.05, 0.25]], dtype=np.float32)  # [step][group]


def expected(p0, g, steps):
    """SGD as torch: group 0 (a) without momentum at the table's column 0;
    group 1 (b) with momentum 0.5 at column 1; past the table its last row.
    The averaged buffer m: the one worker's value."""
    want = p0.copy()
    buf = np.zeros(3, dtype=np.float32)
    for t in range(steps):
        lr = LR[min(t, len(LR) - 1)]
        want[:4] = want[:4] - lr[0] * (g[:4] + np.float32(0) * want[:4])
        buf = np.float32(0.5) * buf + (g[4:7] + np.float32(0) * want[4:7])
        want[4:7] = want[4:7] - lr[1] * buf
    want[7:9] = g[7:9]
    return want


def train(c, steps, after_step=None):
    """The worker's loop over constant pushes; the parameters at the end."""
    n = c.info("n_params")
    c.declare_lr_table(2, len(LR), LR.ravel().tolist())
    p = np.arange(1, n + 1, dtype=np.float32) * np.float32(0.1)
    p0 = p.copy()
    c.set_params(p.ctypes.data, n)
    g = np.full(n, 0.5, dtype=np.float32)
    g[7:9] = [3.0, -1.0]  # the buffer's value, pushed where its gradient would be
    w = _lib.Work()
    done = set()
    while True:
        r = c.next_work(w)
        if r == _lib.NEXT_WORK:
            if not c.work_start(w):
                continue
            for b in range(c.info("n_buckets")):
                c.push_bucket(w, b, g.ctypes.data, 1.0)
            c.work_done(w)
            if after_step and w.step not in done:
                after_step(w.step)
            done.add(w.step)
        elif r == _lib.NEXT_EVAL:
            c.eval_done(w, 0, 0.0)
        elif r == _lib.NEXT_DONE:
            break
        else:
            assert r in (_lib.NEXT_ROLLBACK, _lib.NEXT_REJOINED), r
    assert done == set(range(steps))
    return p, expected(p0, g, steps)


def client(endpoint, table=False):
    """A worker of a, b (group 1) and buffer m, two SGD groups."""
    c = zps.Client(endpoint)
    c.set("join_timeout_ms", 30000)
    c.declare_tensor("a", [4])
    c.declare_tensor("b", [3])
    c.declare_buffer("m", [2], _lib.BUFFER_AVERAGE)
    c.declare_group(0, _lib.INNER_SGD, 0.1)
    c.declare_group(1, _lib.INNER_SGD, 0.1, weight_decay=0.0, momentum=0.5)
    c.declare_tensor_group("b", 1)
    c.declare_dataset(N)
    if table:
        c.declare_lr_table(2)  # announced: the HELLO says it comes
    return c


def test_a_server_with_other_flags_refuses_the_groups_in_one_line(procs):
    s = job(procs, "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.5")
    c = client(s.endpoint)
    c.connect()
    with pytest.raises(zps.ZpsError, match=r"group 0 declares momentum 0, this job's "
                                           r"--momentum is 0.5: start zps-server without "
                                           r"optimizer flags"):
        c.join()
    c.close()
    # The same server takes a declaration without groups: the refusal changed nothing.
    c = zps.Client(s.endpoint)
    c.set("join_timeout_ms", 30000)
    c.declare_tensor("a", [4])
    c.declare_dataset(N)
    c.connect()
    c.join()
    assert c.info("n_params") == 4
    c.close()


def test_a_server_with_schedule_flags_refuses_a_declared_table(procs):
    s = job(procs, "--lr-schedule", "cosine")
    c = zps.Client(s.endpoint)
    c.set("join_timeout_ms", 30000)
    c.declare_tensor("a", [4])
    c.declare_dataset(N)
    c.declare_lr_table(1)  # announced, no groups: the server's optimizer, the worker's rates
    c.connect()
    with pytest.raises(zps.ZpsError, match=r"this job's schedule is the server's .*drop the "
                                           r"scheduler or start zps-server without optimizer"):
        c.join()
    c.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_a_server_without_flags_trains_each_group_with_its_table(procs, shards):
    s = job(procs, "--shards", str(shards))
    if shards == 2:  # shard 1 learns the groups from its ASSIGN's layout
        procs.server("--shard", "1", "--shards", "2", "--coordinator", s.endpoint, name="s1")
    c = client(s.endpoint, table=True)
    c.connect()
    c.join()
    assert c.info("n_params") == 9
    p, want = train(c, STEPS)
    assert np.array_equal(p, want), (p, want)
    c.close()


def test_a_shard_restarted_from_its_checkpoint_keeps_the_groups_and_the_table(procs):
    """Shard 1 killed after step 3 and restarted with --resume: no INIT
    comes again; its groups come with ASSIGN, its table from beside its
    checkpoints, and the replayed run ends bit for bit as the uninterrupted one."""
    import os
    import signal
    import socket

    steps = 6
    ck0, ck1 = os.path.join(procs.tmp, "ck0"), os.path.join(procs.tmp, "ck1")
    s = job(procs, "--shards", "2", "--checkpoint-dir", ck0, "--checkpoint-every", "1",
            "--worker-timeout-ms", "30000", steps=steps)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    shard1 = ["--shard", "1", "--shards", "2", "--coordinator", s.endpoint, "--checkpoint-dir",
              ck1]
    s1 = procs.start("s1", [os.path.join(BIN, "zps-server"), "--listen",
                            f"tcp://127.0.0.1:{port}", *shard1])
    again = []

    def kill_shard_1(step):
        if step == 3 and not again:
            os.kill(s1.pid, signal.SIGKILL)
            s1.wait(timeout=10)
            again.append(procs.start("s1-again", [os.path.join(BIN, "zps-server"), "--listen",
                                                  f"tcp://127.0.0.1:{port}", *shard1,
                                                  "--resume"]))

    c = client(s.endpoint, table=True)
    c.set("timeout_ms", 30000)
    c.connect()
    c.join()
    p, want = train(c, steps, kill_shard_1)
    assert again and "restored step" in procs.log(again[0]), procs.log(again[0])
    assert np.array_equal(p, want), (p, want)
    c.close()


def test_a_coordinator_restarted_from_its_checkpoint_takes_the_declared_groups_again(procs):
    """Shard 0 (alone) killed after step 3 and restarted with --resume: the
    declaration kept beside its checkpoints gives it the groups before any
    worker is back, its table comes from beside them too."""
    import os
    import signal
    import socket

    steps = 6
    ck0 = os.path.join(procs.tmp, "ck0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ep = f"tcp://127.0.0.1:{port}"
    args = [os.path.join(BIN, "zps-server"), "--listen", ep, "--model", "external",
            "--global-batch", "16", "--steps", str(steps), "--workers", "1",
            "--checkpoint-dir", ck0, "--checkpoint-every", "1", "--worker-timeout-ms", "30000"]
    s0 = procs.start("s0", args)
    again = []

    def kill_coordinator(step):
        if step == 3 and not again:
            os.kill(s0.pid, signal.SIGKILL)
            s0.wait(timeout=10)
            again.append(procs.start("s0-again", args + ["--resume"]))

    c = client(ep, table=True)
    c.set("timeout_ms", 30000)
    c.connect()
    c.join()
    p, want = train(c, steps, kill_coordinator)
    assert again and "restored step" in procs.log(again[0]), procs.log(again[0])
    assert np.array_equal(p, want), (p, want)
    c.close()


def test_a_later_worker_must_declare_the_first_workers_groups(procs):
    import threading

    s = job(procs, "--workers", "2")
    first = client(s.endpoint)
    first.connect()
    joined = []
    t = threading.Thread(target=lambda: joined.append(first.join() or True))
    t.start()
    # The first HELLO's declaration is the job's: wait for it to be taken
    # before the other one says HELLO (on a loaded machine it could overtake).
    deadline = time.monotonic() + 30
    while "admitted as rank 0" not in procs.log(s):
        assert time.monotonic() < deadline, procs.log(s)
        time.sleep(0.05)
    other = zps.Client(s.endpoint)
    other.set("join_timeout_ms", 30000)
    other.declare_tensor("a", [4])
    other.declare_tensor("b", [3])
    other.declare_buffer("m", [2], _lib.BUFFER_AVERAGE)
    other.declare_group(0, _lib.INNER_SGD, 0.1)
    other.declare_group(1, _lib.INNER_SGD, 0.1, weight_decay=0.01, momentum=0.5)
    other.declare_tensor_group("b", 1)
    other.declare_dataset(N)
    other.connect()
    try:
        with pytest.raises(zps.ZpsError, match=r"group 1 declares weight_decay 0.01"):
            other.join()
        other.close()
        same = client(s.endpoint)
        same.connect()
        same.join()  # the first's declaration: admitted, and the job starts
        t.join(timeout=60)
        assert joined == [True]
        same.close()
    finally:
        first.stop()
        t.join(timeout=60)
        first.close()
