"""_torch_optim.py - a user's torch optimizer and scheduler, as a zps job
declares them: the shards apply them, so they are read here, never stepped.

An optimizer becomes its type and one group per param_group (lr,
momentum, nesterov, betas, eps, weight_decay), each model parameter
belonging to one group (declared per tensor, as the layout is). A
scheduler whose learning rate depends on the step alone becomes a table
of every group's learning rate at every step of the job: this process runs
the scheduler over the job's steps, then puts it back as it was. What the
shards cannot reproduce (amsgrad, SGD dampening, maximize, a metric-driven
scheduler) is refused here, in one line, before anything is sent.
"""
import warnings

import torch

from . import BadArgument, _lib

_KINDS = {torch.optim.SGD: _lib.INNER_SGD, torch.optim.Adam: _lib.INNER_ADAM,
          torch.optim.AdamW: _lib.INNER_ADAMW}


def _refuse(msg):
    raise BadArgument(_lib.EINVAL, msg)


def _float(v):
    return float(v.item()) if torch.is_tensor(v) else float(v)


def _group_settings(kind, i, group):
    """(lr, momentum, nesterov, weight_decay, beta1, beta2, eps) of group i."""
    if group.get("maximize", False):
        _refuse(f"param_groups[{i}]: maximize=True is not something the shards do")
    if group.get("differentiable", False):
        _refuse(f"param_groups[{i}]: differentiable=True needs autograd, the shards have none")
    lr, wd = _float(group["lr"]), _float(group.get("weight_decay", 0.0))
    if kind == _lib.INNER_SGD:
        if _float(group.get("dampening", 0.0)) != 0.0:
            _refuse(f"param_groups[{i}]: SGD dampening={group['dampening']}: the shards "
                    f"apply torch's SGD with dampening 0")
        return (lr, _float(group.get("momentum", 0.0)), bool(group.get("nesterov", False)), wd,
                0.9, 0.999, 1e-8)
    if group.get("amsgrad", False):
        _refuse(f"param_groups[{i}]: amsgrad=True: the shards apply Adam/AdamW without amsgrad")
    b1, b2 = group["betas"]
    return (lr, 0.0, False, wd, _float(b1), _float(b2), _float(group["eps"]))


def optimizer_groups(optimizer, params):
    """(kind, [settings per group], [group of each of params]) of a torch
    optimizer over exactly the model's parameters."""
    kind = _KINDS.get(type(optimizer))
    if kind is None:
        _refuse(f"optimizer= is a {type(optimizer).__name__}: a synchronous job's shards "
                f"apply torch.optim.SGD, Adam or AdamW (any number of param_groups)")
    where = {}
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        groups.append(_group_settings(kind, i, group))
        for p in group["params"]:
            if id(p) in where:
                _refuse(f"a tensor {list(p.shape)} is in param_groups {where[id(p)]} and {i}")
            where[id(p)] = i
    mine = {id(p) for p in params}
    for p in where:
        if p not in mine:
            _refuse("the optimizer steps a tensor that is not one of the model's parameters: "
                    "build it over model.parameters()")
    # A parameter in no group is one torch never steps (frozen): it goes
    # into a group of its own with lr 0 and no decay, which leaves it as it
    # is on the shards too (the table gives that group 0 at every step).
    frozen = len(groups)
    of = [where.get(id(p), frozen) for p in params]
    if frozen in of:
        groups.append((0.0,) + groups[0][1:3] + (0.0,) + groups[0][4:])
    return kind, groups, of


def _base(scheduler):
    base = getattr(torch.optim.lr_scheduler, "LRScheduler", None)
    return base or torch.optim.lr_scheduler._LRScheduler


def lr_table(scheduler, optimizer, steps, frozen=False):
    """lrs[s * groups + g]: group g's learning rate at the update of step s,
    as the scheduler gives it when stepped once after every optimizer step
    (frozen: and 0 for the group optimizer_groups added last). The
    scheduler and the optimizer's learning rates are put back after."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        _refuse("scheduler= is a ReduceLROnPlateau: its learning rate follows a metric, which "
                "the job cannot know in advance; zps takes schedulers of the step alone")
    if not isinstance(scheduler, _base(scheduler)):
        _refuse(f"scheduler= is a {type(scheduler).__name__}: give a torch.optim.lr_scheduler "
                f"whose learning rate depends on the step alone (LambdaLR, OneCycleLR, ...)")
    if scheduler.optimizer is not optimizer:
        _refuse("scheduler= schedules another optimizer than Run's optimizer=")
    saved = scheduler.state_dict()
    saved_groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    table = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
            for s in range(steps):
                if s:
                    try:
                        scheduler.step()
                    except (ValueError, IndexError) as e:
                        _refuse(f"scheduler= stops at step {s} of the job's {steps}: {e}")
                table.extend(_float(g["lr"]) for g in optimizer.param_groups)
                if frozen:
                    table.append(0.0)
    finally:
        scheduler.load_state_dict(saved)
        for g, kept in zip(optimizer.param_groups, saved_groups):
            g.update(kept)
    return table
