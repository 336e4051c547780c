"""Schedulers follow an optimizer that an adapter or strategy replaces in `prepare`.

A vendor adapter may return a new optimizer (a fused one) from `prepare_optimizer`, a
strategy from `setup` (an engine's optimizer). The
scheduler the user built before `prepare` must then drive the new optimizer: the learning
rate it reports is the one training uses.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from accel import Accelerator
from accel.adapter.cpu import CPUAdapter


class Fused(torch.optim.SGD):
    """Stands for a vendor's fused optimizer, built from the user's one (its base lr)."""


def _replace(self, optimizer, ctx):  # the adapter hook under test, as a vendor writes it
    return Fused([{"params": g["params"], "lr": g.get("initial_lr", g["lr"])} for g in optimizer.param_groups])


def _warmup(opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 4))


def _trained_lr(model: torch.nn.Module, opt, sched, accelerator) -> tuple[float, float]:
    """(lr the scheduler reports, lr the update used), for one SGD step with gradient 1."""
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(1, 1)).sum())
    opt.step()
    used = float((before - model.weight.detach()).squeeze())
    reported = sched.get_last_lr()[0]
    sched.step()
    opt.zero_grad()
    return reported, used


def _setup_replacing(self, group, prepared, ctx):  # a strategy's `setup` that swaps in a fused optimizer
    return group.replace(optimizers=[_replace(self, opt, ctx) for opt in group.optimizers])


@pytest.mark.parametrize("replaced_by", ["adapter", "strategy"])
@pytest.mark.parametrize("how", ["together", "later", "one by one"])
def test_a_scheduler_follows_a_replaced_optimizer(monkeypatch: pytest.MonkeyPatch, how: str, replaced_by: str) -> None:
    from accel.strategies.base import Strategy

    # The adapter's hook (a vendor's fused optimizer) or the strategy's `setup`.
    if replaced_by == "adapter":
        monkeypatch.setattr(CPUAdapter, "prepare_optimizer", _replace)
    else:
        monkeypatch.setattr(Strategy, "setup", _setup_replacing)
    accelerator = Accelerator()
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.004)
    sched = _warmup(opt)
    if how == "together":
        model, opt, sched = accelerator.prepare(model, opt, sched)
    elif how == "later":  # the scheduler prepared in a later call than its optimizer
        model, opt = accelerator.prepare(model, opt)
        sched = accelerator.prepare(sched)
    else:  # Accelerate's per-object methods: `setup` sees each object alone
        model = accelerator.prepare_model(model)
        opt = accelerator.prepare_optimizer(opt)
        sched = accelerator.prepare_scheduler(sched)
    assert isinstance(opt.optimizer, Fused)
    assert sched.scheduler.optimizer is opt.optimizer
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "optimizer.step() has been overridden" warning either
        for step in range(5):
            reported, used = _trained_lr(model, opt, sched, accelerator)
            assert reported == pytest.approx(0.004 * min(1.0, (step + 1) / 4))
            assert used == pytest.approx(reported, rel=1e-4), step


def test_a_scheduler_prepared_before_the_replacement_follows_too(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = Accelerator()
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.004)
    sched = accelerator.prepare(_warmup(opt))
    monkeypatch.setattr(CPUAdapter, "prepare_optimizer", _replace)
    model, opt = accelerator.prepare(model, opt)
    reported, used = _trained_lr(model, opt, sched, accelerator)
    assert used == pytest.approx(reported, rel=1e-4) and reported == pytest.approx(0.001)


def test_a_replacement_with_other_groups_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def regroup(self, optimizer, ctx):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        return Fused([{"params": [p]} for p in params], lr=0.1)

    monkeypatch.setattr(CPUAdapter, "prepare_optimizer", regroup)
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.004)
    with pytest.raises(ValueError, match="has 2 parameter groups, the original 1: its scheduler cannot follow it"):
        accelerator.prepare(model, opt, _warmup(opt))
