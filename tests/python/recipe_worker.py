"""recipe_worker.py - a training script's recipe as a zps worker (or, with
--single, as one process on the global batch): what test_torch_recipes.py
starts, one process per worker, and compares.

The data are synthetic (seeded), the data order is the job's
(zps.torch.global_batch_indices), and --save writes the model's
state_dict, the flat vector the worker holds and the losses, so a test
can compare workers with each other and with the one process.
"""
import argparse
import math
import sys

import torch

import zps.torch as zt

N = 320  # train records


def build(name, seed):
    torch.manual_seed(seed)
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                   torch.nn.Linear(32, 4))
    if name == "bn":
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32),
                                   torch.nn.Tanh(), torch.nn.Linear(32, 4))
    if name == "resnet18":
        import torchvision
        return torchvision.models.resnet18(num_classes=4)
    raise SystemExit(f"no model {name}")


def data(name):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N, 3, 16, 16, generator=g) if name == "resnet18" else \
        torch.randn(N, 16, generator=g)
    return x, torch.randint(0, 4, (N,), generator=g)


def optimizer(args, model):
    if args.optimizer == "none":
        return None
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": other, "weight_decay": 0.0}], lr=args.lr,
                             betas=(0.9, 0.95))


def scheduler(args, opt):
    if args.scheduler == "none" or opt is None:
        return None
    warm = 5  # "lambda": LambdaLR's linear warm-up over 5 steps
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))


def loss_of(model, x, y, args):
    if args.autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        return torch.nn.functional.cross_entropy(out.float(), y)
    return args.loss_scale * torch.nn.functional.cross_entropy(model(x).float(), y)


def piece(model, x, y, idx, args, backward):
    """The loss of the samples idx, backward'ed in micro-batches if asked."""
    loss = loss_of(model, x[idx], y[idx], args)
    backward(loss)
    return float(loss)


def single(args, model, x, y):
    """One process on the global batch (--split a,b: its gradient summed
    from pieces of those sizes, weighted, as the workers' are)."""
    opt = optimizer(args, model)
    sched = scheduler(args, opt)
    losses = []
    split = [int(v) for v in args.split.split(",")] if args.split else [args.global_batch]
    for step in range(args.steps):
        idx = zt.global_batch_indices(N, args.global_batch, args.seed, step)
        for p in model.parameters():
            p.grad = None
        at, total = 0, 0.0
        for n in split:
            loss = loss_of(model, x[idx[at:at + n]], y[idx[at:at + n]], args)
            (loss * (n / args.global_batch) if len(split) > 1 else loss).backward()
            total += float(loss) * n
            at += n
        losses.append(total / args.global_batch)
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if sched:
            sched.step()
    return losses, None


def worker(args, model, x, y):
    opt = optimizer(args, model)
    run = zt.Run(args.coordinator, model, dataset_size=N, share=args.share, timeout=30,
                 join_timeout=60, optimizer=opt, scheduler=scheduler(args, opt),
                 clip_grad_norm=args.clip, buffers=args.buffers,
                 staged=True if args.staged else None, resume_from=args.resume_from)
    losses = {}
    snap = None
    for work in run:
        if work.step == args.snapshot_step and snap is None:
            # what the shards sent for the steps before: the model's state now
            snap = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if args.micro:
            total = 0.0
            for mb in work.micro_batches(args.micro):
                total += piece(model, x, y, mb.indices, args, mb.backward) * mb.count
            losses[work.step] = total / work.count
        else:
            losses[work.step] = piece(model, x, y, work.indices, args, work.backward)
    flat = run._flat.clone()
    run.close()
    args.snap = snap
    return [losses[s] for s in sorted(losses)], flat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator")
    ap.add_argument("--single", action="store_true")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--init-seed", type=int, default=3)
    ap.add_argument("--share", type=int)
    ap.add_argument("--split")
    ap.add_argument("--optimizer", default="adamw-groups")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--scheduler", default="none")
    ap.add_argument("--clip", type=float)
    ap.add_argument("--buffers", default="average")
    ap.add_argument("--micro", type=int)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--staged", action="store_true")
    ap.add_argument("--autocast", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--loss-scale", type=float, default=1.0, help="a loss (and gradient) this "
                    "many times cross-entropy")
    ap.add_argument("--snapshot-step", type=int, default=-1,
                    help="save the model's state as the piece of this step starts")
    ap.add_argument("--resume-from", help="Run(resume_from=): a torch file's model tensors")
    ap.add_argument("--save", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build(args.model, args.init_seed).to(getattr(torch, args.dtype))
    model = model.to(args.device)
    x, y = data(args.model)
    x, y = x.to(getattr(torch, args.dtype)).to(args.device), y.to(args.device)
    losses, flat = (single if args.single else worker)(args, model, x, y)
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save({"state": state, "flat": flat, "losses": losses,
                "snap": getattr(args, "snap", None)}, args.save)
    print("losses", " ".join(f"{v:.4f}" for v in losses))
    return 0 if all(math.isfinite(v) for v in losses) else 1


if __name__ == "__main__":
    sys.exit(main())
