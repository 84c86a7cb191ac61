"""zps.torch in a zps-server --mode diloco job: the user's torch optimizer
takes each round's inner steps, libzps pushes the pseudo-gradient, the
shards' outer step makes the next round's parameters.

- One inner step of torch's SGD and an outer step of lr 1, momentum 0 is
  synchronous SGD: theta - 1 * (theta - (theta - lr g)) = theta - lr g,
  but for the last bits of the subtractions: at most one ulp of theta a
  step apart (docs/tests.md). Compared over 40 steps: past about 100 this
  training is chaotic, and a last-bit difference grows (see docs/pytorch.md).
- Every worker ends a round with the same bits: two torch workers with
  AdamW and int8 pseudo-gradients, and a C zps-worker (the server's
  --optimizer as its inner one) beside a torch worker (its own); with
  --fragments and --overlap, the job ends on the global model, the same
  bits in every worker.
- The refusals: a diloco job without an optimizer, a synchronous one with
  one, an optimizer over tensors that are not the model's.
"""
import os
import time

import numpy as np
import pytest
import torch

import zps
import zps.torch as zt
from conftest import BIN, params, save_arg
from test_torch import N, data, tiny

STEPS = 40  # global batches; short of where training turns round-off into chaos


def tiny_job(procs, *args, steps=STEPS, name="server"):
    return procs.server("--model", "external", "--global-batch", "16", "--steps", str(steps),
                        "--workers", "1", "--lr-schedule", "constant", *args, name=name)


def diloco(*args):
    return ["--mode", "diloco", *args]


def train(run, model):
    x, y = data()
    seen = []
    for work in run:
        seen.append((work.round, work.inner, work.inner_steps, work.step))
        work.backward(torch.nn.functional.cross_entropy(model(x[work.indices]),
                                                        y[work.indices]))
    return seen


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def test_one_inner_step_of_torch_sgd_is_synchronous_sgd(procs):
    s = tiny_job(procs, "--lr", "0.05", "--momentum", "0")
    sync = tiny()
    with zt.Run(s.endpoint, sync, dataset_size=N, join_timeout=30) as run:
        assert run.mode == "sync" and run.inner_steps == 0
        train(run, sync)
        assert run.done
    procs.ok(s, 30)

    d = tiny_job(procs, *diloco("--inner-steps", "1", "--outer-lr", "1", "--outer-momentum",
                                "0"), name="diloco")
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0)  # before Run: the same
    with zt.Run(d.endpoint, model, dataset_size=N, join_timeout=30, optimizer=opt) as run:
        assert run.mode == "diloco" and run.inner_steps == 1
        assert run.total_steps == STEPS  # rounds of one global batch
        seen = train(run, model)
        assert run.done
    procs.ok(d, 30)
    assert seen == [(t, 0, 1, t) for t in range(STEPS)]
    diff = float(np.abs(flat(model) - flat(sync)).max())
    moved = float(np.abs(flat(model) - flat(tiny())).max())
    # The mode rounds once more a step at theta's precision (the inner step
    # lands on theta's grid): at most one ulp of theta a step apart, on a
    # smooth model (tanh) that does not amplify it (check_diloco.c says why).
    top = max(np.abs(flat(sync)).max(), np.abs(flat(tiny())).max())
    bound = STEPS * float(top) * 2.0 ** -23
    print(f"diloco H=1, SGD: max |diloco - sync| = {diff:.3g} after {STEPS} steps "
          f"(moved {moved:.3g}; bound {bound:.3g})")
    assert moved > 1e-2
    assert diff <= bound


def test_a_round_is_h_inner_steps_of_consecutive_global_batches(procs):
    s = tiny_job(procs, *diloco("--inner-steps", "4"), steps=12)
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30, optimizer=opt) as run:
        assert run.inner_steps == 4 and run.total_steps == 3
        seen = train(run, model)
        assert run.done
    procs.ok(s, 30)
    assert seen == [(r, h, 4, 4 * r + h) for r in range(3) for h in range(4)]
    assert opt.state  # the optimizer's own state, kept across the rounds
    ps = list(model.parameters())
    at = 0
    for p in ps:  # parameters and gradients still views of the flat vectors
        assert p.data_ptr() == ps[0].data_ptr() + 4 * at
        assert p.grad.data_ptr() == ps[0].grad.data_ptr() + 4 * at
        at += p.numel()


def two_adamw_workers(procs, steps, *mode):
    """Two torch workers with AdamW in a diloco job of `steps` global batches:
    their final parameters, and how far the first moved from the start."""
    s = procs.server("--model", "external", "--global-batch", "64", "--steps", str(steps),
                     "--workers", "2", "--lr-schedule", "constant", *diloco(*mode))
    init = os.path.join(procs.tmp, "init.params")
    adamw = ["--diloco", "--optimizer", "adamw", "--lr", "0.001"]
    a = procs.torch_worker("w0", s.endpoint, *adamw, "--save-init", init, *save_arg(procs, "w0"))
    b = procs.torch_worker("w1", s.endpoint, *adamw, *save_arg(procs, "w1"))
    procs.ok(a, 180)
    procs.ok(b, 180)
    procs.ok(s, 30)
    w0, w1 = params(procs, "w0"), params(procs, "w1")
    return w0, w1, float(np.abs(w0 - np.fromfile(init, dtype=np.float32)).max())


def test_two_torch_workers_with_adamw_and_int8_end_with_the_same_bits(procs):
    w0, w1, moved = two_adamw_workers(procs, 20, "--inner-steps", "4", "--compress", "int8")
    print(f"2 torch workers, AdamW, H=4, int8, 5 rounds: moved {moved:.3g}")
    assert w0.size == 54314
    assert np.array_equal(w0, w1)
    assert moved > 1e-2


def test_two_torch_workers_with_fragments_and_overlap_end_on_the_same_global_model(procs):
    # --fragments 2 --overlap: each worker's fragments are at different
    # points between exchanges, and the job ends on the global model, the
    # same bits in both torch models.
    w0, w1, moved = two_adamw_workers(procs, 24, "--inner-steps", "4", "--fragments", "2",
                                      "--overlap")
    print(f"2 torch workers, AdamW, H=4, 2 fragments, overlap, 6 rounds: moved {moved:.3g}")
    assert np.array_equal(w0, w1)
    assert moved > 1e-2


def test_a_c_worker_and_a_torch_worker_in_one_diloco_job_end_with_the_same_bits(procs):
    # The C worker's inner optimizer is the server's --optimizer, the torch
    # worker's its own: each worker's inner steps are its own business.
    s = procs.server("--model", "mlp:784-512-512-10", "--global-batch", "64", "--steps", "16",
                     "--workers", "2", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9",
                     *diloco("--inner-steps", "4"))
    c = procs.start("c", [os.path.join(BIN, "zps-worker"), "--coordinator", s.endpoint,
                          "--share", "24", "--save-params", os.path.join(procs.tmp, "c.params")])
    init = os.path.join(procs.tmp, "init.params")
    t = procs.torch_worker("t", s.endpoint, "--model", "mlp:784-512-512-10", "--share", "40",
                           "--diloco", "--optimizer", "adamw", "--lr", "0.001",
                           "--save-init", init, *save_arg(procs, "t"))
    procs.ok(c, 180)
    procs.ok(t, 180)
    procs.ok(s, 30)
    cw, tw = params(procs, "c"), params(procs, "t")
    moved = float(np.abs(tw - np.fromfile(init, dtype=np.float32)).max())
    print(f"C (SGD) + torch (AdamW) workers, H=4, 4 rounds: moved {moved:.3g}")
    assert cw.size == 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert np.array_equal(cw, tw)
    assert moved > 1e-2


def test_a_diloco_job_without_an_optimizer_is_refused_and_the_worker_leaves(procs):
    # Refused once admitted (the mode comes with the job), with a BYE. As
    # for any rank 0 of an external model that leaves before sending the
    # initial values, that job then waits for them (docs/library.md).
    s = tiny_job(procs, *diloco("--inner-steps", "4"))
    t = time.monotonic()
    with pytest.raises(zps.BadArgument, match=r"diloco job .* own optimizer: give Run "
                                              r"optimizer="):
        zt.Run(s.endpoint, tiny(), dataset_size=N, join_timeout=30)
    assert time.monotonic() - t < 15
    deadline = time.monotonic() + 10
    while "left at step 0" not in procs.log(s):
        assert time.monotonic() < deadline, procs.log(s)
        time.sleep(0.05)


def test_a_synchronous_job_with_optimizer_flags_refuses_another_optimizer_in_one_line(procs):
    # Its shards would run the flags' SGD (momentum 0.9), not this one.
    s = tiny_job(procs)
    model = tiny()
    with pytest.raises(zps.Refused, match=r"group 0 declares momentum 0, this job's --momentum "
                                          r"is 0.9: start zps-server without optimizer flags"):
        zt.Run(s.endpoint, model, dataset_size=N, join_timeout=30,
               optimizer=torch.optim.SGD(model.parameters(), lr=0.05))


def test_an_optimizer_of_other_tensors_is_refused_before_joining():
    model = tiny()
    other = torch.nn.Linear(2, 2)
    with pytest.raises(zps.BadArgument, match=r"not one of the model's parameters"):
        zt.Run("tcp://127.0.0.1:9", model, dataset_size=N,
               optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    with pytest.raises(zps.BadArgument, match=r"torch.optim.Optimizer"):
        zt.Run("tcp://127.0.0.1:9", model, dataset_size=N, optimizer="adamw")


def test_the_sync_calls_are_refused_in_a_diloco_job_and_inner_done_in_a_sync_one(procs):
    for args, name in ((diloco("--inner-steps", "2"), "d"), ((), "s")):
        s = tiny_job(procs, *args, steps=4, name=name)
        c = zps.Client(s.endpoint)
        c.set("join_timeout_ms", 30000)
        c.declare_tensor("w", [8])
        c.declare_dataset(N)
        c.connect()
        c.join()
        buf = torch.zeros(8)
        c.set_params(buf.data_ptr(), 8)
        w = zps._lib.Work()
        assert c.next_work(w) == zps._lib.NEXT_WORK and c.work_start(w)
        if name == "d":
            assert (w.round, w.inner, w.inner_steps, w.step) == (0, 0, 2, 0)
            with pytest.raises(zps.ZpsError, match="pushes no gradients"):
                c.push_bucket(w, 0, buf.data_ptr(), 0.0)
            with pytest.raises(zps.ZpsError, match="zps_inner_done"):
                c.work_done(w)
            c.inner_done(w, 0.5)
        else:
            assert (w.round, w.inner, w.inner_steps) == (0, 0, 0)
            with pytest.raises(zps.BadArgument, match="not a diloco job"):
                c.inner_done(w, 0.5)
        c.leave()
        c.close()
