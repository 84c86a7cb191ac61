"""zps.checkpoint - a job's checkpoints as torch files.

    python3 -m zps.checkpoint export CKPT_DIR out.pt [--step T]
    python3 -m zps.checkpoint info CKPT_DIR [--step T]

A job started with zps-server --checkpoint-dir CKPT_DIR leaves every
shard's shard-<I>-step-<T>.ckpt (its range of the flat vector and the
optimizer's state there) and, for a declared model (--model external,
zps.torch), the declared-model record (the tensors' names, shapes, groups,
roles and the optimizer's parameter groups). `export` writes the newest
complete step (every shard's file of it present and valid) as
torch.save({'model': state_dict, 'optimizer': optimizer state_dict, 'step':
T}): the names are the layout's, the optimizer's param_groups the declared
groups, its state torch.optim's (Adam, AdamW: step, exp_avg, exp_avg_sq;
SGD: momentum_buffer), so torch.load and optimizer.load_state_dict go on
from it in plain torch. It is what `zps-ctl export` would be; zps-ctl has
no Python in it, so the command is this module's.

Reading: there is one reader of the checkpoint format, common/zps_ckpt.c,
the one the shards restore from; libzps 1.5 exposes it (zps_checkpoint_open
of include/zps.h: the step choice, size, format, CRC-32 and meta checks,
the shards' ranges gathered into one vector). Nothing here parses the
files, so a change of the format cannot leave a second reader behind.
zps.torch.load_checkpoint loads the same into a model and an optimizer.
"""
import argparse
import ctypes
import sys
import warnings

import torch

from . import ZpsError, _lib, error, version
from ._lib import lib

__all__ = ["Checkpoint", "export"]

OPTIMIZERS = {_lib.INNER_SGD: "SGD", _lib.INNER_ADAM: "Adam", _lib.INNER_ADAMW: "AdamW"}
ROLES = {0: "parameter", _lib.BUFFER_AVERAGE: "buffer", _lib.BUFFER_BROADCAST: "buffer"}


class Checkpoint:
    """The checkpoint of `step` in `directory` (None: the newest complete
    one), read whole through libzps. .step, .shards, .n_params,
    .optimizer ("SGD", "Adam", "AdamW"), .optim_step (updates applied,
    Adam's t), .seed; .params and .state (the optimizer's slots) as flat
    float32 tensors; .tensors [(name, shape, group, role)] and .groups
    [dict of the declared hyperparameters], or None and [] when the
    directory has no declared model (a job of a built-in model)."""

    def __init__(self, directory, step=None):
        if not _lib.has("zps_checkpoint_open"):
            major, minor, _ = version()
            raise ZpsError(_lib.EINVAL, f"libzps {major}.{minor} has no zps_checkpoint_open: "
                                        f"reading checkpoints needs libzps 1.5 or later")
        self.directory = str(directory)
        k = ctypes.c_void_p()
        why = ctypes.create_string_buffer(1024)
        err = lib.zps_checkpoint_open(self.directory.encode(), -1 if step is None else int(step),
                                      ctypes.byref(k), why, len(why))
        if err != _lib.OK:
            raise error(err, why.value.decode(errors="replace"))
        try:
            self._read(k)
        finally:
            lib.zps_checkpoint_destroy(ctypes.byref(k))

    def _read(self, k):
        info = lambda key: lib.zps_checkpoint_info(k, key)  # noqa: E731
        self.step = info(_lib.CHECKPOINT_STEP)
        self.shards = info(_lib.CHECKPOINT_SHARDS)
        self.n_params = info(_lib.CHECKPOINT_N_PARAMS)
        self.optimizer = OPTIMIZERS[info(_lib.CHECKPOINT_OPTIM)]
        self.optim_step = info(_lib.CHECKPOINT_OPTIM_STEP)
        self.seed = info(_lib.CHECKPOINT_SEED)
        slots = 1 if self.optimizer == "SGD" else 2
        arrays = []
        for what in range(1 + slots):
            t = torch.empty(self.n_params, dtype=torch.float32)
            err = lib.zps_checkpoint_read(k, what, t.data_ptr(), self.n_params)
            if err != _lib.OK:
                raise error(err, f"{self.directory}: reading array {what}")
            arrays.append(t)
        self.params, self.state = arrays[0], arrays[1:]
        self.tensors = self._tensors(k, info(_lib.CHECKPOINT_N_TENSORS)) or None
        self.groups = [self._group(k, g) for g in range(info(_lib.CHECKPOINT_N_GROUPS))]

    @staticmethod
    def _tensors(k, n):
        out = []
        name, ndim, group, role = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        shape = (ctypes.c_int64 * 8)()
        for i in range(n):
            err = lib.zps_checkpoint_tensor(k, i, ctypes.byref(name), ctypes.byref(ndim), shape,
                                            ctypes.byref(group), ctypes.byref(role))
            if err != _lib.OK:
                raise error(err, f"tensor {i} of the declared model")
            out.append((name.value.decode(), tuple(shape[:ndim.value]), group.value, role.value))
        return out

    @staticmethod
    def _group(k, g):
        kind, nesterov = ctypes.c_int(), ctypes.c_int()
        d = [ctypes.c_double() for _ in range(6)]
        err = lib.zps_checkpoint_group(k, g, ctypes.byref(kind), ctypes.byref(d[0]),
                                       ctypes.byref(d[1]), ctypes.byref(nesterov),
                                       *[ctypes.byref(x) for x in d[2:]])
        if err != _lib.OK:
            raise error(err, f"group {g} of the declared model")
        # lr, momentum and weight_decay travel as float32: the shortest
        # decimal of the float is what the script wrote (0.001, not 0.0010000000474...)
        lr, momentum, wd, b1, b2, eps = (x.value for x in d)
        out = {"kind": OPTIMIZERS[kind.value], "lr": _short(lr), "weight_decay": _short(wd)}
        if kind.value == _lib.INNER_SGD:
            out.update(momentum=_short(momentum), nesterov=bool(nesterov.value))
        else:
            out.update(betas=(b1, b2), eps=eps)
        return out

    def require_layout(self):
        """The declared tensors, or a one-line error saying there are none."""
        if self.tensors is None:
            raise ZpsError(_lib.ENOENT, f"{self.directory}: no declared-model record (a job of a "
                                        f"built-in model, zps-server --model mlp:...): its "
                                        f"tensors have no names to load by")
        return self.tensors

    def _spans(self):
        at = 0
        for name, shape, group, role in self.require_layout():
            n = 1
            for d in shape:
                n *= d
            yield name, shape, group, role, at, at + n
            at += n

    def model_state(self):
        """{name: tensor} in layout order: the parameters and the buffers
        the job declared (a state_dict with the model's own names)."""
        return {name: self.params[lo:hi].view(shape).clone()
                for name, shape, _, _, lo, hi in self._spans()}

    def param_state(self, slot_names=None):
        """[(name, {state name: tensor})] of the parameters, in layout
        order, in torch.optim's format."""
        out = []
        for name, shape, group, role, lo, hi in self._spans():
            if role != 0:
                continue
            if self.optimizer == "SGD":
                momentum = self.groups[group]["momentum"] if self.groups else 1.0
                st = {"momentum_buffer": (self.state[0][lo:hi].view(shape).clone()
                                          if momentum != 0 else None)}
            else:
                st = {"step": torch.tensor(float(self.optim_step)),
                      "exp_avg": self.state[0][lo:hi].view(shape).clone(),
                      "exp_avg_sq": self.state[1][lo:hi].view(shape).clone()}
            out.append((name, group, st))
        return out

    def optimizer_state(self):
        """The optimizer's state_dict as torch.optim's optimizer over the
        layout's parameters with the declared groups would give it."""
        entries = self.param_state()
        groups = self.groups
        if not groups:
            warnings.warn(f"{self.directory}: the job's optimizer came from zps-server's flags, "
                          f"which checkpoints do not record: param_groups hold torch's defaults",
                          stacklevel=2)
            groups = [{"kind": self.optimizer, "lr": 0.001 if self.optimizer != "SGD" else 0.0}]
        dummies = [[] for _ in groups]
        by_name = {}
        for name, group, _ in entries:
            p = torch.nn.Parameter(torch.zeros(1))
            dummies[group].append(p)
            by_name[name] = p
        cls = getattr(torch.optim, self.optimizer)
        opt = cls([dict({k: v for k, v in g.items() if k != "kind"}, params=ps)
                   for g, ps in zip(groups, dummies) if ps],
                  lr=groups[0]["lr"])
        for name, _, st in entries:
            opt.state[by_name[name]] = st
        return opt.state_dict()


def _short(x):
    """A float32's value as the shortest decimal that reads back as it."""
    for digits in range(1, 10):
        y = float(f"{x:.{digits}g}")
        if torch.tensor(y, dtype=torch.float32).item() == x:
            return y
    return x


def export(directory, out, step=None):
    """Writes the checkpoint of step (None: the newest complete one) of
    directory as torch.save({'model', 'optimizer', 'step'}) to out; returns
    the Checkpoint."""
    ck = Checkpoint(directory, step)
    torch.save({"model": ck.model_state(), "optimizer": ck.optimizer_state(), "step": ck.step},
               out)
    return ck


def _describe(ck):
    lines = [f"{ck.directory}: step {ck.step}, {ck.shards} shard(s), {ck.n_params} floats, "
             f"{ck.optimizer} ({ck.optim_step} updates), seed {ck.seed}"]
    if ck.tensors is None:
        lines.append("no declared-model record: a job of a built-in model")
    else:
        for name, shape, group, role in ck.tensors:
            lines.append(f"  {name} {list(shape)} {ROLES.get(role, role)} group {group}")
        for g, d in enumerate(ck.groups):
            lines.append(f"  group {g}: {d}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m zps.checkpoint",
                                 description="a zps job's checkpoints as torch files")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="torch.save({'model', 'optimizer', 'step'}) of a step")
    ex.add_argument("dir")
    ex.add_argument("out")
    ex.add_argument("--step", type=int, default=None, help="default: the newest complete")
    inf = sub.add_parser("info", help="the step, the optimizer and the declared tensors")
    inf.add_argument("dir")
    inf.add_argument("--step", type=int, default=None)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "export":
            ck = export(args.dir, args.out, args.step)
            print(f"{args.out}: step {ck.step} of {args.dir} ({len(ck.tensors or [])} tensors, "
                  f"{ck.optimizer})")
        else:
            print(_describe(Checkpoint(args.dir, args.step)))
    except ZpsError as e:
        print(f"zps.checkpoint: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
