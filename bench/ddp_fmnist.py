"""bench/ddp_fmnist.py - the DDP baseline of bench/diloco.sh: zps's default job
(MLP 784-512-512-10, Fashion-MNIST, global batch 128, SGD lr 0.05 momentum
0.9, cosine over --steps) under torch.nn.parallel.DistributedDataParallel
(gloo), on zps's data order, evaluated on the test set at every epoch's end.
Run once per host by deploy/netns-cluster.sh -x, which sets ZPS_NETNS_RANK,
ZPS_NETNS_SIZE and ZPS_NETNS_MASTER (ZPS_NETNS_PORT: the rendezvous port,
default 29500):

  PYTHONPATH=python /usr/bin/python3 bench/ddp_fmnist.py --steps 4500 --target 0.85

Rank r takes slice [r B/W, (r+1) B/W) of step t's global batch
(zps.torch.global_batch_indices: the indices a zps job takes at step t), so
the job is the one zps computes with the same batch, up to float summation
order, when --init gives zps's initial values (raw float32, zps's flat
order: what `zps-worker --save-params` writes after one step at lr 0;
bench/diloco.sh makes them). Without it: He-normal weights and zero
biases, as zps, the same distribution but not the same draws. An epoch is 60000 // B steps, as zps drops the last
partial batch. At its end each rank evaluates its quarter of the test set
and the counts are summed (all_reduce of 2 numbers); rank 0 prints
`{"epoch": E, "test_accuracy": A, "step": S}`, zps's metrics-log line, and
every rank stops after the first epoch at or above --target (0: never)."""
import argparse
import datetime
import json
import math
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import zps.torch as zt  # noqa: E402
from torch_fmnist import DATA, build, load  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp:784-512-512-10")
    p.add_argument("--steps", type=int, default=4500, help="the schedule's length")
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine")
    p.add_argument("--seed", type=int, default=0, help="zps's data-order seed")
    p.add_argument("--target", type=float, default=0.0, help="stop at this test accuracy")
    p.add_argument("--init", help="the initial parameters, raw float32 (zps's flat order)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=DATA)
    p.add_argument("--timeout", type=float, default=120.0, help="s to wait for the other ranks")
    a = p.parse_args()
    rank = int(os.environ["ZPS_NETNS_RANK"])
    size = int(os.environ["ZPS_NETNS_SIZE"])
    master = os.environ["ZPS_NETNS_MASTER"]
    port = int(os.environ.get("ZPS_NETNS_PORT", "29500"))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    if a.global_batch % size:
        p.error("--global-batch must be a multiple of the world size")
    torch.set_num_threads(a.threads)
    x, y = load(a.data, "train")
    xt, yt = load(a.data, "test")
    torch.manual_seed(1)
    model = build(a.model)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):  # zps's initialisation: He-normal, zero biases
            torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            torch.nn.init.zeros_(m.bias)
    if a.init:
        values = torch.from_numpy(np.fromfile(a.init, dtype=np.float32))
        torch.nn.utils.vector_to_parameters(values, model.parameters())
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=a.timeout))
    ddp = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's values
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    local = a.global_batch // size
    lo, hi = rank * local, (rank + 1) * local
    per_epoch = len(y) // a.global_batch
    tlo, thi = rank * len(yt) // size, (rank + 1) * len(yt) // size

    def lr_at(step):  # common/zps_optim.c, without warm-up
        if a.lr_schedule == "constant":
            return a.lr
        return a.lr * 0.5 * (1.0 + math.cos(math.pi * step / a.steps))

    for step in range(a.steps):
        idx = zt.global_batch_indices(len(y), a.global_batch, a.seed, step)[lo:hi]
        loss = loss_fn(ddp(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()  # DDP's all-reduce averages the ranks' gradients here
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        if (step + 1) % per_epoch:
            continue
        model.eval()
        with torch.no_grad():
            correct = int((model(xt[tlo:thi]).argmax(1) == yt[tlo:thi]).sum())
        model.train()
        counts = torch.tensor([correct, thi - tlo], dtype=torch.float64)
        dist.all_reduce(counts)
        acc = float(counts[0] / counts[1])
        if rank == 0:
            print(json.dumps({"epoch": (step + 1) // per_epoch - 1, "test_accuracy": round(acc, 6),
                              "step": step}), flush=True)
        if 0 < a.target <= acc:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
