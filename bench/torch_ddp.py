"""bench/torch_ddp.py - the DDP baseline of bench/torch.sh and bench/all.sh: one
rank of examples/torch_fmnist.py's CNN (or, with --model mlp:784-512-512-10,
zps's default MLP) under torch.nn.parallel.DistributedDataParallel (gloo,
loopback), on zps's data order. Start one process per rank:

  PYTHONPATH=python bench/torch_ddp.py --rank R --world-size 2 --port PORT --steps S

Each rank takes its slice of the global batch zt.global_batch_indices gives,
so the job is the one a zps run of --global-batch computes. After --warmup
untimed steps (DDP builds its buckets in the first ones), rank 0 prints
`ddp: S steps of B on N ranks, X ms/step` over the S timed steps, then
`median: Y ms/step over S steps` (the median of the steps' own times, as
bench/all.sh compares with zps's per-step medians). --world-size 1 is one
plain process on the whole global batch, no DDP and no process group
(`single: ...` instead of `ddp: ...`; --port is not needed)."""
import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import zps.torch as zt  # noqa: E402
from torch_fmnist import DATA, build, load  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, help="rank 0's TCP store on 127.0.0.1 (world size > 1)")
    p.add_argument("--model", default="cnn", help="cnn (default) or mlp:D0-D1-...")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", default=DATA)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="s to wait for the other ranks (gloo's default is 30 min)")
    a = p.parse_args()
    if a.global_batch % a.world_size:
        p.error("--global-batch must be a multiple of --world-size")
    if a.world_size > 1 and a.port is None:
        p.error("--port is needed with --world-size > 1")
    # Without it gloo binds the address the hostname resolves to, which on
    # some hosts is not loopback.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(a.threads)
    x, y = load(a.data, "train")
    torch.manual_seed(1)  # torch_fmnist.py's --init-seed; DDP broadcasts rank 0's anyway
    model = build(a.model)
    ddp = model
    if a.world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank,
                                world_size=a.world_size,
                                timeout=datetime.timedelta(seconds=a.timeout))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    local = a.global_batch // a.world_size
    lo, hi = a.rank * local, (a.rank + 1) * local

    def step(s):
        idx = zt.global_batch_indices(len(y), a.global_batch, 0, s)[lo:hi]
        loss = loss_fn(ddp(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()  # DDP's all-reduce averages the ranks' gradients here
        opt.step()

    for s in range(a.warmup):
        step(s)
    if a.world_size > 1:
        dist.barrier()
    start = time.perf_counter()
    times = []
    for s in range(a.warmup, a.warmup + a.steps):
        t0 = time.perf_counter()
        step(s)
        times.append(time.perf_counter() - t0)
    ms = (time.perf_counter() - start) * 1e3 / max(a.steps, 1)
    if a.rank == 0:
        if a.world_size > 1:
            print(f"ddp: {a.steps} steps of {a.global_batch} on {a.world_size} ranks, "
                  f"{ms:.2f} ms/step", flush=True)
        else:
            print(f"single: {a.steps} steps of {a.global_batch}, {ms:.2f} ms/step", flush=True)
        print(f"median: {statistics.median(times) * 1e3:.3f} ms/step over {len(times)} steps",
              flush=True)
    if a.world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
