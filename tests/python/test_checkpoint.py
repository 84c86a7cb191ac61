"""test_checkpoint.py - a job's checkpoints as torch files (docs/pytorch.md,
Checkpoints): python3 -m zps.checkpoint export, zps.torch.load_checkpoint
and Run(resume_from=), against real zps-server processes.

One AdamW job of 2 workers and 2 shards (recipe_worker.py, 11 steps, a
checkpoint every step) gives the files: the export of its newest step is
the workers' final model bit for bit; its step 10 loaded into a plain
torch AdamW and stepped once on the global batch of step 10 is the job's
step 11 within Adam's round-off; a step one shard lacks, or holds damaged,
is passed over; a job of a built-in model says it has no names. A job
started with resume_from= starts from the file's values bit for bit.
"""
import argparse
import os
import shutil
import sys
import warnings

import pytest
import torch

import zps
import zps.torch as zt
from zps import checkpoint as zc

from conftest import BIN, PYTHON

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import recipe_worker as rw  # noqa: E402

STEPS = 11


def _job(procs, ckpt):
    """The AdamW job of two workers (shares 28 and 12) over two shards."""
    s = procs.server("--model", "external", "--global-batch", "40", "--steps", str(STEPS),
                     "--workers", "2", "--seed", "1", "--shards", "2", "--checkpoint-dir", ckpt,
                     "--checkpoint-every", "1")
    procs.start("shard1", [os.path.join(BIN, "zps-server"), "--shard", "1", "--shards", "2",
                           "--coordinator", s.endpoint, "--listen", "tcp://127.0.0.1:*",
                           "--checkpoint-dir", ckpt])
    ws = [procs.start(n, [PYTHON, rw.__file__, "--coordinator", s.endpoint, "--share", share,
                          "--steps", str(STEPS), "--save", os.path.join(procs.tmp, n + ".pt")])
          for n, share in (("w0", "28"), ("w1", "12"))]
    for w in ws:
        procs.ok(w, 120)
    procs.ok(s, 30)
    return [torch.load(os.path.join(procs.tmp, n + ".pt")) for n in ("w0", "w1")]


def _recipe(model):
    args = argparse.Namespace(optimizer="adamw-groups", lr=0.01)
    return rw.optimizer(args, model)


def _grad_step(model, opt, x, y, idx, split):
    """One optimizer step on the samples idx, the gradient summed from
    pieces of sizes split, weighted as the shards weigh the workers'."""
    opt.zero_grad(set_to_none=True)
    at = 0
    for n in split:
        loss = torch.nn.functional.cross_entropy(model(x[idx[at:at + n]]), y[idx[at:at + n]])
        (loss * (n / len(idx))).backward()
        at += n
    opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _gap(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_export_and_load_checkpoint_continue_the_job_in_plain_torch(procs):
    ckpt = os.path.join(procs.tmp, "ckpt")
    w0, w1 = _job(procs, ckpt)
    out = os.path.join(procs.tmp, "out.pt")
    # python3 -m zps.checkpoint export, in this process (docs/pytorch.md
    # runs the command itself; a second torch import would double the time)
    assert zc.main(["export", ckpt, out]) == 0
    f = torch.load(out)
    assert f["step"] == STEPS and list(f["model"]) == list(w0["state"])
    for k, v in w0["state"].items():
        assert torch.equal(f["model"][k], v) and torch.equal(f["model"][k], w1["state"][k]), k
    groups = f["optimizer"]["param_groups"]
    assert [(g["weight_decay"], g["lr"], g["betas"]) for g in groups] == \
        [(0.1, 0.01, (0.9, 0.95)), (0.0, 0.01, (0.9, 0.95))]
    assert all(float(st["step"]) == STEPS for st in f["optimizer"]["state"].values())
    # The file is torch's: a fresh model and AdamW take it as they are.
    model = rw.build("mlp", 99)
    model.load_state_dict(f["model"])
    opt = _recipe(model)
    opt.load_state_dict(f["optimizer"])

    # Step 10 into a plain torch AdamW, one step on the global batch of
    # step 10: the job's step 11 (Adam magnifies the split's round-off on
    # near-zero gradients: bounded by what the split alone does, as
    # test_torch_recipes.py bounds it).
    x, y = rw.data("mlp")
    idx = torch.as_tensor(zt.global_batch_indices(rw.N, 40, 1, 10), dtype=torch.long)
    steps = {}
    for split in ([40], [28, 12]):
        model = rw.build("mlp", 99)
        opt = _recipe(model)
        assert zt.load_checkpoint(model, ckpt, optimizer=opt, step=10) == 10
        steps[len(split)] = _grad_step(model, opt, x, y, idx, split)
    own = _gap(steps[1], steps[2])
    gap = _gap(steps[2], w0["state"])
    assert gap <= max(4 * own, 1e-6), (gap, own)
    # Without the shards' moments the step would be another one.
    model = rw.build("mlp", 99)
    zt.load_checkpoint(model, ckpt, step=10)
    fresh = _grad_step(model, _recipe(model), x, y, idx, [28, 12])
    assert _gap(fresh, w0["state"]) > 100 * max(gap, 1e-7)

    # The newest step is that of every shard: one missing or damaged
    # file passes it over for the one before.
    part = os.path.join(procs.tmp, "part")
    shutil.copytree(ckpt, part)
    os.remove(os.path.join(part, f"shard-1-step-{STEPS}.ckpt"))
    with open(os.path.join(part, f"shard-0-step-{STEPS - 1}.ckpt"), "r+b") as fh:
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    assert zc.Checkpoint(part).step == STEPS - 2
    with pytest.raises(zps.ZpsError):
        zc.Checkpoint(part, step=STEPS)
    # A model that is not the job's, and a job of a built-in model, in one line.
    with pytest.raises(zps.BadArgument, match=r"tensor 0.weight is \[32, 16\], the model's"):
        zt.load_checkpoint(torch.nn.Sequential(torch.nn.Linear(8, 32)), ckpt)
    with pytest.raises(zps.BadArgument, match="holds the state of AdamW"):
        m = rw.build("mlp", 99)
        zt.load_checkpoint(m, ckpt, optimizer=torch.optim.SGD(m.parameters(), lr=0.1))
    os.remove(os.path.join(part, "declared-model"))
    with pytest.raises(zps.ZpsError, match="no declared-model record"):
        zt.load_checkpoint(rw.build("mlp", 99), part)
    with pytest.raises(zps.ZpsError, match="no checkpoint"):
        zc.Checkpoint(os.path.join(procs.tmp, "none"))


def test_a_job_resumed_from_a_torch_file_starts_from_its_values(procs):
    src = rw.build("mlp", 5)
    path = os.path.join(procs.tmp, "model.pt")
    opt = torch.optim.AdamW(src.parameters())
    src(torch.randn(2, 16)).sum().backward()
    opt.step()
    torch.save({"model": src.state_dict(), "optimizer": opt.state_dict(), "step": 1}, path)
    s = procs.server("--model", "external", "--global-batch", "40", "--steps", "2",
                     "--workers", "1", "--seed", "1")
    model = rw.build("mlp", 6)  # other values: the file's must win
    x, y = rw.data("mlp")
    # lr 0 and no decay: the job's parameters are its initial ones to the bit.
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)
    with pytest.warns(zt.ZpsWarning, match="its optimizer state is not"):
        run = zt.Run(s.endpoint, model, dataset_size=rw.N, join_timeout=30, optimizer=sgd,
                     resume_from=path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with run:
            for work in run:
                for k, v in src.state_dict().items():
                    assert torch.equal(model.state_dict()[k], v), (work.step, k)
                idx = torch.as_tensor(work.indices, dtype=torch.long)
                work.backward(torch.nn.functional.cross_entropy(model(x[idx]), y[idx]))
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    procs.ok(s, 30)
