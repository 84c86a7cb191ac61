"""bench/ddp_gpt.py - the DDP baseline of bench/gpt.sh: one rank of
examples/torch_gpt.py's character-level GPT, trained with that script's own
recipe (its model, text windows, AdamW parameter groups, SequentialLR
warm-up then cosine, clip_grad_norm_ at --clip, bf16 autocast around the
forward, all imported from it) under torch.nn.parallel.DistributedDataParallel
(gloo, loopback), on zps's data order. Start one process per rank:

  PYTHONPATH=python bench/ddp_gpt.py --rank R --world-size 2 --port PORT --steps S

Each rank takes its slice of the global batch zt.global_batch_indices gives
(--seed, the job's), so the job is the one a zps run of --global-batch
computes. The schedule spans the --warmup untimed steps and the --steps
timed ones (--lr-warmup is the schedule's linear warm-up, torch_gpt.py's
--warmup). After the untimed steps (DDP builds its buckets in the first
ones), rank 0 prints `ddp: S steps of B on N ranks, X ms/step` over the S
timed steps, then `median: Y ms/step over S steps` (the median of the
steps' own times). --world-size 1 is one plain process on the whole global
batch, no DDP and no process group (`single: ...` instead of `ddp: ...`;
--port is not needed)."""
import argparse
import datetime
import os
import statistics
import sys
import time
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import zps.torch as zt  # noqa: E402
from torch_gpt import GPT, TEXT, load_text, loss_of, recipe, windows  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--port", type=int, help="rank 0's TCP store on 127.0.0.1 (world size > 1)")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=1, help="the data order's (zps-server --seed)")
    p.add_argument("--init-seed", type=int, default=0, help="initial values (rank 0's)")
    # torch_gpt.py's model and recipe, its defaults.
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--lr-warmup", type=int, default=20, help="the schedule's linear warm-up steps")
    p.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_'s max_norm (0: none)")
    p.add_argument("--no-autocast", action="store_true", help="fp32 matmuls")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--threads", type=int, default=1)
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
    warnings.filterwarnings("ignore", message="The epoch parameter")  # as torch_gpt.py
    codes, vocab = load_text(a.text)
    data = windows(codes, a.block)
    torch.manual_seed(a.init_seed)  # DDP broadcasts rank 0's anyway
    model = GPT(vocab, a.block, a.width, a.layers, a.heads)
    ddp = model
    if a.world_size > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank,
                                world_size=a.world_size,
                                timeout=datetime.timedelta(seconds=a.timeout))
        # The one buffer, the causal mask, is a constant: no broadcast of it
        # before every forward (DDP's default), which zps does not do either.
        ddp = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    # torch_gpt.py's recipe over the whole run's steps, as a zps job of
    # --steps warmup + steps would declare it.
    opt, sched = recipe(model, argparse.Namespace(lr=a.lr, weight_decay=a.weight_decay,
                                                  warmup=a.lr_warmup, steps=a.warmup + a.steps))
    local = a.global_batch // a.world_size
    lo, hi = a.rank * local, (a.rank + 1) * local

    def step(s):
        idx = zt.global_batch_indices(len(data), a.global_batch, a.seed, s)[lo:hi]
        opt.zero_grad(set_to_none=True)
        loss = loss_of(ddp, data[idx], not a.no_autocast)
        loss.backward()  # DDP's all-reduce averages the ranks' gradients here
        if a.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        sched.step()

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
