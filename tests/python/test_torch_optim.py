"""python/zps/_torch_optim.py: a torch optimizer and scheduler read as a
job declares them (no server: what is declared, and what is refused)."""
import pytest
import torch

import zps
from zps import _lib, _torch_optim


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 2))


def groups_of(m):
    decay = [p for p in m.parameters() if p.dim() >= 2]
    other = [p for p in m.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]


def test_adamw_groups_are_declared_per_tensor_with_each_groups_settings():
    m = model()
    opt = torch.optim.AdamW(groups_of(m), lr=3e-3, betas=(0.9, 0.95), eps=1e-7)
    kind, groups, of = _torch_optim.optimizer_groups(opt, list(m.parameters()))
    assert kind == _lib.INNER_ADAMW
    assert of == [0, 1, 1, 1, 0, 1]  # weight, bias, norm weight, norm bias, weight, bias
    lr, momentum, nesterov, wd, b1, b2, eps = groups[0]
    assert (lr, wd, b1, b2, eps) == (3e-3, 0.1, 0.9, 0.95, 1e-7)
    assert groups[1][3] == 0.0


def test_sgd_nesterov_settings_are_read():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                          weight_decay=1e-4)
    kind, groups, of = _torch_optim.optimizer_groups(opt, list(m.parameters()))
    assert kind == _lib.INNER_SGD and of == [0] * 6
    assert groups[0][:4] == (0.1, 0.9, True, 1e-4)


@pytest.mark.parametrize("make, reason", [
    (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "is a RMSprop"),
    (lambda ps: torch.optim.Adam(ps, amsgrad=True), "amsgrad=True"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5), "dampening"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, maximize=True), "maximize"),
])
def test_what_the_shards_cannot_do_is_refused_in_one_line(make, reason):
    m = model()
    with pytest.raises(zps.BadArgument, match=reason):
        _torch_optim.optimizer_groups(make(m.parameters()), list(m.parameters()))


def test_the_lr_table_is_the_schedulers_and_leaves_it_as_it_was():
    m = model()
    opt = torch.optim.AdamW(groups_of(m), lr=1.0)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=3)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7, eta_min=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    table = _torch_optim.lr_table(sched, opt, 10)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]  # put back
    assert sched.last_epoch == 0
    expected = []
    with pytest.warns(UserWarning):  # torch 1.13's SequentialLR warns about itself
        for _ in range(10):
            expected.extend(g["lr"] for g in opt.param_groups)
            opt.step()
            sched.step()
    assert table == pytest.approx(expected, rel=0, abs=0)


def test_per_group_lambdas_give_per_group_rows():
    m = model()
    opt = torch.optim.SGD(groups_of(m), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [lambda s: s + 1, lambda s: 1.0 / (s + 1)])
    assert _torch_optim.lr_table(sched, opt, 3) == [0.5, 0.5, 1.0, 0.25, 1.5, 0.5 / 3]


def test_a_metric_driven_or_too_short_scheduler_is_refused():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with pytest.raises(zps.BadArgument, match="ReduceLROnPlateau"):
        _torch_optim.lr_table(torch.optim.lr_scheduler.ReduceLROnPlateau(opt), opt, 5)
    one = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=4)
    with pytest.raises(zps.BadArgument, match="stops at step 5 of the job's 8"):
        _torch_optim.lr_table(one, opt, 8)
    other = torch.optim.SGD(m.parameters(), lr=0.5)
    with pytest.raises(zps.BadArgument, match="another optimizer"):
        _torch_optim.lr_table(torch.optim.lr_scheduler.StepLR(other, 2), opt, 5)


def test_parameters_in_no_group_are_frozen_by_a_group_of_lr_0():
    m = model()
    ps = list(m.parameters())
    opt = torch.optim.AdamW(ps[:2], lr=0.1, weight_decay=0.1)
    kind, groups, of = _torch_optim.optimizer_groups(opt, ps)
    assert of == [0, 0, 1, 1, 1, 1]
    assert groups[1][0] == 0.0 and groups[1][3] == 0.0  # lr 0, no decay: left as they are
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    assert _torch_optim.lr_table(sched, opt, 3, frozen=True) == [0.1, 0.0, 0.05, 0.0, 0.025, 0.0]
