"""Under fp16 the grad scaler steps through the adapter's own optimizer step (a vendor's fused update)."""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator, GradScalerKwargs
from accel.adapter.cpu import CPUAdapter


def test_fp16_scaling_and_a_vendor_step_compose(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def vendor_step(self, optimizer, closure=None):
        calls.append(type(optimizer).__name__)
        return optimizer.step()

    monkeypatch.setattr(CPUAdapter, "optimizer_step", vendor_step)
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0**10)])
    assert accelerator.scaler is not None
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    before = model.weight.detach().clone()
    accelerator.backward(model(torch.ones(4, 2)).sum())
    opt.step()
    assert calls == ["SGD"] and not opt.step_was_skipped
    assert not torch.equal(before, model.weight.detach())
    # The scheduler's step tracking on the optimizer survived the routing.
    assert getattr(opt.optimizer.step, "_wrapped_by_lr_sched", False)
    # An overflowing step is skipped by the scaler: the vendor step does not run.
    opt.zero_grad()
    accelerator.backward(model(torch.ones(4, 2)).sum() * float("inf"))
    after = model.weight.detach().clone()
    opt.step()
    assert calls == ["SGD"] and opt.step_was_skipped
    assert torch.equal(after, model.weight.detach())


def test_one_precision_object_per_run_and_an_adapter_supplies_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Accelerator, its optimizers and `backward` share one `Precision`; an adapter's subclass is the one used."""
    from accel.precision.base import Precision

    calls: list[str] = []

    class Recorded(Precision):
        def convert_module(self, model, ctx):
            calls.append("convert_module")
            assert ctx.precision is self
            return super().convert_module(model, ctx)

        def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
            calls.append("scale_loss")
            return super().scale_loss(loss)

        def step(self, optimizer, closure=None):
            calls.append("step")
            return super().step(optimizer, closure)

    monkeypatch.setattr(CPUAdapter, "precision_class", Recorded, raising=False)
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 1)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(accelerator.precision, Recorded) and opt.precision is accelerator.precision
    accelerator.backward(model(torch.ones(1, 2)).sum())
    opt.step()
    assert calls == ["convert_module", "scale_loss", "step"]
