#!/usr/bin/python3
"""torch_gpt.py - a small character-level GPT trained the way GPT recipes
train it, as zps workers or alone, with the same data order.

  zps-server --model external --global-batch 32 --steps 300 --workers 2 --seed 1
  torch_gpt.py --coordinator tcp://HOST:5555 --steps 300 [--share N]
  torch_gpt.py --single --steps 300 --global-batch 32 --seed 1

The recipe is the usual one, and each part of it is the user's own torch
object, handed to zt.Run rather than rewritten for zps:
- tied weights: the output layer is the token embedding;
- AdamW with two parameter groups: decay on the matrices, none on biases,
  norms and the embedding;
- warm-up then cosine decay, a torch SequentialLR (LinearLR, then
  CosineAnnealingLR);
- clipping at 1.0 by the global norm;
- bf16 autocast around the forward.
The server takes the optimizer, the schedule and the clipping from rank 0
(started without optimizer flags): the shards step them. --single trains
the same model alone on each step's whole global batch, in zps's data order
(zt.global_batch_indices), with the same torch objects stepped locally:
what the zps run computes, to round-off over the first steps (bf16 autocast
rounds each piece's matmuls on its own, and AdamW amplifies round-off; at
these rates training is chaotic past ~100 steps, docs/tests.md).

The text is one every Debian system has: base-files' copy of the GPL
(/usr/share/common-licenses/GPL-3). Each sample is a window of --block + 1
characters (inputs and the next-character targets) at a stride of
--block / 2.
"""
import argparse
import math
import sys
import time
import warnings

import torch

import zps.torch as zt

TEXT = "/usr/share/common-licenses/GPL-3"


def load_text(path):
    """(samples: LongTensor [n, block + 1] of character codes, vocabulary size)."""
    with open(path, "rb") as f:
        raw = f.read()
    return torch.tensor(list(raw), dtype=torch.long), 256


def windows(codes, block):
    starts = torch.arange(0, len(codes) - block - 1, block // 2)
    return torch.stack([codes[s:s + block + 1] for s in starts.tolist()])


class GPT(torch.nn.Module):
    """Token and position embeddings, a causal TransformerEncoder (pre-norm),
    a final LayerNorm and an output layer tied to the token embedding."""

    def __init__(self, vocab, block, width, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(torch.zeros(block, width))
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        mask = torch.triu(torch.full((block, block), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)
        torch.nn.init.normal_(self.pos, std=0.02)
        torch.nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.tok(idx) + self.pos[:t]
        h = self.body(h, mask=self.mask[:t, :t])
        return self.head(self.norm(h))


def param_groups(model, weight_decay):
    """GPT's two groups: decay on the matrices of the linear layers, none on
    biases, norms, the position table and the (tied) embedding."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        matrix = p.dim() >= 2 and not name.startswith(("tok.", "pos"))
        (decay if matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def recipe(model, args):
    opt = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95), eps=1e-8)
    warm = max(1, min(args.warmup, args.steps - 1))
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0 / warm, total_iters=warm),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, args.steps - warm),
                                                   eta_min=args.lr * 0.1)], milestones=[warm])
    return opt, sched


def loss_of(model, batch, autocast):
    x, y = batch[:, :-1], batch[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x)
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             y.reshape(-1))


def single(args, model, data):
    """One process on each step's whole global batch (--split: the batch's
    gradient summed from pieces of those sizes, weighted, as workers do)."""
    opt, sched = recipe(model, args)
    split = [int(v) for v in args.split.split(",")] if args.split else [args.global_batch]
    losses = []
    for step in range(args.steps):
        idx = zt.global_batch_indices(len(data), args.global_batch, args.seed, step)
        opt.zero_grad(set_to_none=True)
        at, total = 0, 0.0
        for n in split:
            loss = loss_of(model, data[idx[at:at + n]], not args.no_autocast)
            (loss * (n / args.global_batch) if len(split) > 1 else loss).backward()
            total += float(loss) * n
            at += n
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        losses.append(total / args.global_batch)
        report(args, step, losses[-1])
    return losses


def worker(args, model, data):
    opt, sched = recipe(model, args)
    run = zt.Run(args.coordinator, model, dataset_size=len(data), share=args.share,   # zps
                 optimizer=opt, scheduler=sched, clip_grad_norm=args.clip or None,      # zps
                 timeout=args.timeout, join_timeout=args.join_timeout)                  # zps
    losses = {}
    for work in run:                                                                    # zps
        loss = loss_of(model, data[work.indices], not args.no_autocast)
        work.backward(loss)                                                             # zps
        losses[work.step] = float(loss)
        report(args, work.step, losses[work.step])
    run.close()                                                                         # zps
    return [losses[s] for s in sorted(losses)]


def report(args, step, loss):
    if args.log_every and step % args.log_every == 0:
        print(f"step {step} loss {loss:.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--coordinator", help="the job's shard 0, tcp://HOST:PORT")
    ap.add_argument("--single", action="store_true", help="train alone on the global batch")
    ap.add_argument("--share", type=int, help="fixed samples of each global batch")
    ap.add_argument("--steps", type=int, default=300, help="the job's steps (the schedule's)")
    ap.add_argument("--global-batch", type=int, default=32, help="--single: samples per step")
    ap.add_argument("--seed", type=int, default=1, help="--single: the job's --seed")
    ap.add_argument("--split", help="--single: sum the gradient from pieces of these sizes")
    ap.add_argument("--init-seed", type=int, default=0, help="initial values (rank 0's)")
    ap.add_argument("--block", type=int, default=32, help="characters of context")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak learning rate")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=20, help="steps of linear warm-up")
    ap.add_argument("--clip", type=float, default=1.0, help="clip_grad_norm_'s max_norm (0: none)")
    ap.add_argument("--no-autocast", action="store_true", help="fp32 matmuls")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--join-timeout", type=float, default=600.0)
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--save", help="write the model's state_dict and the losses here")
    args = ap.parse_args()
    if not args.single and not args.coordinator:
        ap.error("--coordinator ENDPOINT, or --single")
    torch.set_num_threads(args.threads)
    # torch 1.13's SequentialLR steps its schedulers with an epoch itself
    # and then warns the caller about it.
    warnings.filterwarnings("ignore", message="The epoch parameter")
    codes, vocab = load_text(args.text)
    data = windows(codes, args.block)
    torch.manual_seed(args.init_seed)
    model = GPT(vocab, args.block, args.width, args.layers, args.heads)
    t = time.perf_counter()
    losses = (single if args.single else worker)(args, model, data)
    ms = 1000 * (time.perf_counter() - t) / max(1, len(losses))
    with torch.no_grad():  # the final model on the same 256 windows, in every mode
        held = loss_of(model, data[:256], not args.no_autocast)
    print(f"steps {len(losses)} ms/step {ms:.1f}; loss of the final model on the first 256 "
          f"windows {float(held):.4f}", flush=True)
    if args.save:
        torch.save({"state": model.state_dict(), "losses": losses}, args.save)
    return 0 if all(math.isfinite(v) for v in losses) else 1


if __name__ == "__main__":
    sys.exit(main())
