#!/usr/bin/python3
"""torch_fmnist.py - a PyTorch CNN on Fashion-MNIST, trained as a zps worker
or alone, with the same data order and the same initial values.

  zps-server --model external --global-batch 64 --steps 900 --workers 2 ...
  torch_fmnist.py --coordinator tcp://HOST:5555 [--share N] [--save FILE]
  zps-run --workers 2 --steps 900 --global-batch 64 -- python3 torch_fmnist.py [--save FILE]
  torch_fmnist.py --single --steps 900 --global-batch 64 --lr 0.05 ... [--save FILE]
  torch_fmnist.py --coordinator tcp://HOST:5555 --diloco --optimizer adamw --lr 1e-3 ...

The first form is what a user's training loop becomes (the lines marked
zps); under zps-run (python -m zps.run, docs/pytorch.md's Launch) the
coordinator and share come from ZPS_COORDINATOR and ZPS_SHARE, and a
{rank} in --save's FILE is the copy's ZPS_RANK_HINT. The third trains
alone on each step's whole global batch in zps's data order
(zt.global_batch_indices) with torch.optim's optimizer of the shards'
settings: what a zps run of the same job computes, to round-off
(compare within about 30-80 steps: at these rates training is chaotic
past about 100, a last-bit difference grows).

--model mlp:784-512-512-10 makes the model the nn.Sequential of Linear and
ReLU of zps-worker's built-in MLP, whose flat layout is the same: a torch
worker then joins a job of C workers. The data are Debian's
dataset-fashion-mnist files, scaled to [0, 1] as zps-worker does.

A zps-server --deterministic --micro-batch M job (run.micro_batch M)
is computed micro-batch by micro-batch (work.micro_batches(M)), so its
final parameters are the same bits for any number of workers and split.

--diloco joins a zps-server --mode diloco job: the worker trains each
round's inner steps with torch.optim's optimizer of --optimizer, --lr, ...
(constant lr), which it gives zt.Run, and keeps its state across rounds.
"""
import argparse
import gzip
import math
import os
import sys
import time

import numpy as np
import torch

import zps
import zps.torch as zt

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzipped) as a numpy array of its shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(directory, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / np.float32(255.0)).unsqueeze(1)
    return x, torch.from_numpy(y.astype(np.int64))


def build(spec):
    if spec == "cnn":
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 64), torch.nn.ReLU(),
            torch.nn.Linear(64, 10))
    if spec.startswith("mlp:"):
        dims = [int(d) for d in spec[4:].split("-")]
        layers = [torch.nn.Flatten()]
        for i in range(len(dims) - 1):
            layers.append(torch.nn.Linear(dims[i], dims[i + 1]))
            if i < len(dims) - 2:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)
    sys.exit(f"torch_fmnist: --model {spec!r}: cnn or mlp:D0-D1-...")


def flat(model):
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def save(model, path):
    if path:
        flat(model).numpy().tofile(path)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        dev = next(model.parameters()).device
        correct = sum(int((model(x[i:i + 1000].to(dev)).argmax(1).cpu() == y[i:i + 1000]).sum())
                      for i in range(0, len(y), 1000))
    model.train()
    return correct / len(y)


def lr_at(a, step):
    """The shards' learning rate at step (common/zps_optim.c)."""
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    if a.lr_schedule == "constant" or a.steps <= a.warmup_steps:
        return a.lr
    t, span = step - a.warmup_steps, a.steps - a.warmup_steps
    return a.lr * 0.5 * (1.0 + math.cos(math.pi * t / span))


def optimizer(a, params):
    betas = tuple(float(b) for b in a.betas.split(","))
    if a.optimizer == "sgd":
        return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                               weight_decay=a.weight_decay or 0.0)
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr, betas=betas, eps=a.eps,
                                weight_decay=a.weight_decay or 0.0)
    wd = 0.01 if a.weight_decay is None else a.weight_decay
    return torch.optim.AdamW(params, lr=a.lr, betas=betas, eps=a.eps, weight_decay=wd)


def single(a, model, x, y):
    """One process on each step's whole global batch: the reference."""
    if a.init:
        values = torch.from_numpy(np.fromfile(a.init, dtype=np.float32))
        torch.nn.utils.vector_to_parameters(values, model.parameters())
    opt = optimizer(a, model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    start = time.perf_counter()
    for step in range(a.steps):
        idx = zt.global_batch_indices(len(y), a.global_batch, a.seed, step)
        with zt.sample_context(a.seed, step, idx):
            loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step)
        opt.step()
    ms = (time.perf_counter() - start) * 1e3 / max(a.steps, 1)
    print(f"single: {a.steps} steps of {a.global_batch}, {ms:.2f} ms/step", flush=True)


def worker(a, model, x, y, xt, yt):
    loss_fn = torch.nn.CrossEntropyLoss()

    def evaluate(offset, count):  # the test records an epoch's end asks for
        model.eval()
        with torch.no_grad():
            out = model(xt[offset:offset + count].to(a.device)).cpu()
            loss = float(torch.nn.functional.cross_entropy(out, yt[offset:offset + count],
                                                           reduction="sum"))
            correct = int((out.argmax(1) == yt[offset:offset + count]).sum())
        model.train()
        return correct, loss

    inner = optimizer(a, model.parameters()) if a.diloco else None  # diloco: this worker's
    run = zt.Run(a.coordinator, model, dataset_size=len(y), share=a.share,  # zps
                 test_size=len(yt), evaluate=evaluate, timeout=a.timeout,
                 join_timeout=a.join_timeout, optimizer=inner)
    rank = run.rank
    with run:
        for work in run:                                       # zps
            if a.save_init and work.step == 0:  # the job's initial values (rank 0's or the server's)
                save(model, a.save_init)
                a.save_init = None
            if run.micro_batch:  # a deterministic job: its micro-batches of M, each alone
                for mb in work.micro_batches(run.micro_batch):  # zps
                    xb, yb = x[mb.indices].to(a.device), y[mb.indices].to(a.device)
                    mb.backward(loss_fn(model(xb), yb))
            else:
                xb, yb = x[work.indices].to(a.device), y[work.indices].to(a.device)
                work.backward(loss_fn(model(xb), yb))          # zps
            if a.sleep_ms:
                time.sleep(a.sleep_ms / 1e3)
    t, n = run.timing, max(run.timing["pieces"], 1)
    print(f"worker rank {rank}: {t['pieces']} pieces; per piece: python layer "
          f"{t['python_s'] * 1e3 / n:.3f} ms, backward {t['backward_s'] * 1e3 / n:.2f} ms, "
          + (f"optimizer {t['optimizer_s'] * 1e3 / n:.2f} ms, " if a.diloco else "") +
          f"pushes {t['lib_s'] * 1e3 / n:.2f} ms, waiting {t['wait_s'] * 1e3 / n:.2f} ms; "
          f"{'done' if run.done else 'ended before the job'}", flush=True)
    return run.done


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--coordinator", help="worker mode: the job's shard 0 (default "
                   "$ZPS_COORDINATOR, which zps-run sets)")
    p.add_argument("--single", action="store_true", help="train alone (the reference)")
    p.add_argument("--model", default="cnn", help="cnn (default) or mlp:D0-D1-...")
    p.add_argument("--data", default=DATA, help=f"the IDX files (default {DATA})")
    p.add_argument("--init-seed", type=int, default=1, help="torch.manual_seed of the initial "
                   "values (rank 0's are the job's)")
    p.add_argument("--device", default="cpu", help="worker: where the model computes (cpu, "
                   "cuda, cuda:1; a GPU trains through zps.torch's staged path)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--share", type=int, default=None, help="fixed samples of each step")
    p.add_argument("--save", help="the final parameters, raw float32 (under zps-run a "
                   "{rank} in FILE becomes $ZPS_RANK_HINT)")
    p.add_argument("--save-init", help="worker: the job's initial parameters, raw float32")
    p.add_argument("--init", help="--single: start from these raw float32 parameters")
    p.add_argument("--timeout", type=float, default=60.0, help="s of coordinator silence")
    p.add_argument("--join-timeout", type=float, default=600.0, help="s to wait for the job")
    p.add_argument("--sleep-ms", type=float, default=0, help="per piece: a slower worker")
    p.add_argument("--test-accuracy", action="store_true", help="print it at the end")
    p.add_argument("--test-size", type=int, default=None, help="worker: the test records "
                   "the job evaluates at each epoch's end (default all 10000; 0: none)")
    p.add_argument("--diloco", action="store_true", help="worker of a --mode diloco job: "
                   "inner steps with torch.optim's --optimizer, --lr, ... (constant lr)")
    g = p.add_argument_group("--single: the job's settings, as zps-server was given them; "
                             "--diloco: the inner optimizer's")
    g.add_argument("--steps", type=int, default=30)
    g.add_argument("--global-batch", type=int, default=128)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    g.add_argument("--lr", type=float, default=0.05)
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--nesterov", action="store_true")
    g.add_argument("--weight-decay", type=float, default=None)
    g.add_argument("--betas", default="0.9,0.999")
    g.add_argument("--eps", type=float, default=1e-8)
    g.add_argument("--lr-schedule", choices=["constant", "cosine"], default="cosine")
    g.add_argument("--warmup-steps", type=int, default=0)
    a = p.parse_args()
    if a.single and a.coordinator:
        p.error("--single trains alone: no --coordinator")
    if not a.single and not (a.coordinator or os.environ.get("ZPS_COORDINATOR")):
        p.error("give --coordinator ENDPOINT (or run under zps-run, which sets "
                "ZPS_COORDINATOR) or --single")
    hint = os.environ.get("ZPS_RANK_HINT", "0")
    a.save = a.save and a.save.replace("{rank}", hint)
    a.save_init = a.save_init and a.save_init.replace("{rank}", hint)
    torch.set_num_threads(a.threads)
    x, y = load(a.data, "train")
    xt, yt = load(a.data, "test")
    if a.test_size is not None:
        xt, yt = xt[:a.test_size], yt[:a.test_size]
    torch.manual_seed(a.init_seed)
    model = build(a.model)
    if a.single and a.device != "cpu":
        p.error("--single trains on the CPU: no --device")
    model = model.to(a.device)
    try:
        if a.single:
            single(a, model, x, y)
            ok = True
        else:
            ok = worker(a, model, x, y, xt, yt)
    except zps.ZpsError as e:
        print(f"torch_fmnist: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("torch_fmnist: interrupted: left the job", file=sys.stderr)
        sys.exit(130)
    save(model, a.save)
    if a.test_accuracy:
        print(f"test accuracy {accuracy(model, xt, yt):.4f}", flush=True)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
