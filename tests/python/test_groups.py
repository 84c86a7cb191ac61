"""test_groups.py - the user's optimizer on the shards (libzps 1.4): a
worker declares parameter groups, a buffer and a learning-rate table; a
server started with optimizer flags that differ refuses the declaration
with one line naming the difference, and one started without them trains
each tensor with its own group's rates (docs/optimizers.md).

No torch: the worker is the bare Client over numpy buffers.
"""
import numpy as np
import pytest

import zps
from zps import _lib

N = 64  # train records
STEPS = 3


def job(procs, *args, name="server"):
    workers = [] if "--workers" in args else ["--workers", "1"]
    return procs.server("--model", "external", "--global-batch", "16", "--steps", str(STEPS),
                        *workers, *args, name=name)


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
    n = c.info("n_params")
    assert n == 9
    lr = np.array([[0.1, 0.0], [0.2, 0.5], [0.05, 0.25]], dtype=np.float32)
    c.declare_lr_table(2, STEPS, lr.ravel().tolist())
    p0 = np.arange(1, n + 1, dtype=np.float32) * np.float32(0.1)
    p = p0.copy()
    c.set_params(p.ctypes.data, n)
    g = np.full(n, 0.5, dtype=np.float32)
    g[7:9] = [3.0, -1.0]  # the buffer's value, pushed where its gradient would be
    w = _lib.Work()
    steps = 0
    while True:
        r = c.next_work(w)
        if r == _lib.NEXT_WORK:
            if not c.work_start(w):
                continue
            for b in range(c.info("n_buckets")):
                c.push_bucket(w, b, g.ctypes.data, 1.0)
            c.work_done(w)
            steps += 1
        elif r == _lib.NEXT_EVAL:
            c.eval_done(w, 0, 0.0)
        elif r == _lib.NEXT_DONE:
            break
        else:
            assert r in (_lib.NEXT_ROLLBACK, _lib.NEXT_REJOINED), r
    assert steps == STEPS
    # SGD as torch: group 0 (a) without momentum at the table's column 0;
    # group 1 (b) with momentum 0.5 at column 1.
    want = p0.copy()
    buf = np.zeros(3, dtype=np.float32)
    for t in range(STEPS):
        want[:4] = want[:4] - lr[t, 0] * (g[:4] + np.float32(0) * want[:4])
        buf = np.float32(0.5) * buf + (g[4:7] + np.float32(0) * want[4:7])
        want[4:7] = want[4:7] - lr[t, 1] * buf
    want[7:9] = g[7:9]  # the averaged buffer: the one worker's value
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
