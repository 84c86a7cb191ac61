#!/usr/bin/env python3
"""bench/wire_lossless.py - how far a lossless code would shrink what
crosses the links each step, for bench/cluster.sh's flat model and for two
real models: the exact-fp32 way under the links' bound (README, Speed,
row g; docs/measurements.md, "Lossless coding of the wire").

  /usr/bin/python3 bench/wire_lossless.py [--steps 60] [--flat 1048576]

For each model, SGD with the job's defaults (lr 0.05, momentum 0.9) on one
process, at a few steps: the size after `zstd -1` of
  - delta:  the new parameters XOR the previous step's, the bytes of each
            float apart (byte planes), what a shard would send a host
            that holds the previous step;
  - params: the new parameters, byte planes, what it sends today;
  - grad:   the step's gradient (the mean of the ranks'), byte planes,
            what a host pushes;
each as a fraction of the fp32 bytes. Models: flat (zps-worker's
flat gradient, a fixed draw of 16-bit integers times 1e-8 for each of 8
ranks, averaged: what bench/cluster.sh -H 4 -g 2 pushes, on P floats
from zero), mlp:784-512-512-10 and examples/torch_fmnist.py's CNN on
Fashion-MNIST, batch 64. Needs python3-torch, python3-numpy and zstd
(install-deps.sh --bench)."""
import argparse
import gzip
import struct
import subprocess

import numpy as np
import torch
import torch.nn as nn

DATA = "/usr/share/datasets/fashion-mnist"
LR, MOMENTUM = 0.05, 0.9


def zstd_size(data):
    return len(subprocess.run(["zstd", "-1", "-c", "-q"], input=data, check=True,
                              capture_output=True).stdout)


def planes(a):
    """fp32 array -> its bytes, the k-th byte of every float together."""
    return np.ascontiguousarray(a.view(np.uint8).reshape(-1, 4).T).tobytes()


def sizes(prev, cur, grad):
    n = cur.nbytes
    delta = cur.view(np.uint32) ^ prev.view(np.uint32)
    return (zstd_size(planes(delta)) / n, zstd_size(planes(cur)) / n,
            zstd_size(planes(grad)) / n)


def flat_grad(n, rank):
    """worker/zps_backend.c's s_fill_flat for seed 0 ^ rank."""
    x = ((rank * 2654435761) & 0xffffffff) | 1
    out = np.empty(n, np.int32)
    for i in range(n):
        x ^= (x << 13) & 0xffffffff
        x ^= x >> 17
        x ^= (x << 5) & 0xffffffff
        out[i] = (x & 0xffff) - 0x8000
    return out.astype(np.float32) * np.float32(1e-8)


def run_flat(n, steps, report):
    grad = np.mean([flat_grad(n, r) for r in range(8)], axis=0, dtype=np.float64)
    grad = grad.astype(np.float32)
    params = torch.zeros(n, requires_grad=True)
    opt = torch.optim.SGD([params], lr=LR, momentum=MOMENTUM)
    prev = params.detach().numpy().copy()
    for step in range(1, steps + 1):
        params.grad = torch.from_numpy(grad)
        opt.step()
        cur = params.detach().numpy().copy()
        if step in report:
            yield step, sizes(prev, cur, grad)
        prev = cur


def idx(path):
    with gzip.open(path) as f:
        data = f.read()
    n = struct.unpack(">I", data[4:8])[0]
    return np.frombuffer(data, np.uint8, offset=16 if data[3] == 3 else 8), n


def run_torch(kind, steps, report):
    x, n = idx(f"{DATA}/train-images-idx3-ubyte.gz")
    y, _ = idx(f"{DATA}/train-labels-idx1-ubyte.gz")
    X = torch.tensor(x.reshape(n, 784), dtype=torch.float32) / 255.0
    Y = torch.tensor(y, dtype=torch.long)
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10))
    else:
        X = X.reshape(n, 1, 28, 28)
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(64 * 49, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def flat(what):
        return torch.cat([what(p).reshape(-1) for p in model.parameters()]).numpy().copy()
    prev = flat(lambda p: p.detach())
    for step in range(1, steps + 1):
        batch = torch.randint(0, n, (64,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(X[batch]), Y[batch]).backward()
        grad = flat(lambda p: p.grad)
        opt.step()
        cur = flat(lambda p: p.detach())
        if step in report:
            yield step, sizes(prev, cur, grad)
        prev = cur


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--flat", type=int, default=1 << 20, help="floats of the flat model")
    a = ap.parse_args()
    report = sorted({1, 10, a.steps // 2, a.steps})
    print("| model | step | delta | params | grad |")
    print("|---|---|---|---|---|")
    runs = [(f"flat:{a.flat}", run_flat(a.flat, a.steps, report)),
            ("mlp:784-512-512-10", run_torch("mlp", a.steps, report)),
            ("torch_fmnist.py's CNN", run_torch("cnn", a.steps, report))]
    for name, rows in runs:
        for step, (delta, params, grad) in rows:
            print(f"| {name} | {step} | {delta:.3f} | {params:.3f} | {grad:.3f} |", flush=True)


if __name__ == "__main__":
    main()
