"""The run's precision under the Gaudi adapter (emulated) is a `GaudiPrecision`, and a run through it
converts the same modules and gives the same losses as the adapter's own `apply_precision` gave
before the precision object took it over (issue 15, item 5)."""

from __future__ import annotations

import functools

import pytest
import torch
from accel import Accelerator
from accel.adapter.base import Adapter
from accel.precision.base import Precision
from accel_gaudi import GaudiAdapter, hpu_emulated
from accel_gaudi.precision import GaudiPrecision
from torch import nn
from torch.utils.checkpoint import checkpoint

# Measured with the adapter's `apply_precision` override (commit ced50ad9, before `GaudiPrecision`):
# 5 SGD steps of `Checkpointed` below, mse loss per step. `bf16_plain` and `bf16_force` differ
# (bf16 autocasts only with `force_autocast`, Gaudi's rule); the fp8 runs differ from both.
FP8 = [0.9973328709602356, 0.871624767780304, 0.7704620957374573, 0.6836041212081909, 0.5969672203063965]
FP8_UNDER_BF16_AUTOCAST = [
    0.9980916380882263,
    0.8721970915794373,
    0.7688926458358765,
    0.683322548866272,
    0.5980765223503113,
]
BF16_UNWRAPPED = [0.9998263120651245, 0.8660327196121216, 0.7639756202697754, 0.6736859679222107, 0.5877262949943542]
BF16_AUTOCAST = [1.000045895576477, 0.8652735948562622, 0.7630867958068848, 0.6736181378364563, 0.5869624614715576]
FP8_MODULES = ["block.0", "block.2", "head"]


class Checkpointed(nn.Module):
    """Two fp8-able Linears in a (optionally checkpointed) block, a plain matmul autocast changes, a Linear head."""

    def __init__(self, gradient_checkpointing: bool) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 1)
        self.mix = nn.Parameter(torch.randn(16, 16) / 4)
        self.gradient_checkpointing = gradient_checkpointing
        self._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._gradient_checkpointing_func(self.block, x) if self.gradient_checkpointing else self.block(x)
        return self.head(torch.matmul(h, self.mix))


def run(mixed_precision: str, gradient_checkpointing: bool = False) -> tuple[Accelerator, list[str], list[float]]:
    model = Checkpointed(gradient_checkpointing)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision=mixed_precision)
    model, opt = acc.prepare(model, opt)
    converted = sorted(n for n, m in model.named_modules() if hpu_emulated.is_fp8_linear(m))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    y = torch.randn(8, 1, generator=torch.Generator().manual_seed(5))
    losses = []
    for _ in range(5):
        out = model(x)
        assert out.dtype == torch.float32
        loss = nn.functional.mse_loss(out, y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return acc, converted, losses


def assert_losses(losses: list[float], expected: list[float]) -> None:
    # The configurations differ from each other by >= 5e-4 at some step; 1e-6 leaves room for CPU kernels only.
    torch.testing.assert_close(
        torch.tensor(losses, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-6
    )


def test_the_adapter_hands_its_precision_to_the_core_and_keeps_no_apply_precision():
    assert GaudiAdapter.precision_class is GaudiPrecision and issubclass(GaudiPrecision, Precision)
    assert GaudiAdapter.apply_precision is Adapter.apply_precision
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8")
    assert type(acc.precision) is GaudiPrecision and acc.precision.adapter is acc.adapter
    assert acc.precision.scaler is None and acc.scaler is None


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_fp8_run_converts_the_same_modules_and_gives_the_same_losses(gradient_checkpointing):
    acc, converted, losses = run("fp8", gradient_checkpointing)
    assert type(acc.precision) is GaudiPrecision and acc.precision.fp8 and not acc.precision.autocasts
    assert converted == FP8_MODULES
    assert_losses(losses, FP8)


@pytest.mark.parametrize(
    ("env", "mixed_precision", "modules", "expected"),
    [
        ({}, "bf16", [], BF16_UNWRAPPED),
        ({"ACCEL_GAUDI_FORCE_AUTOCAST": "1"}, "bf16", [], BF16_AUTOCAST),
        ({"ACCEL_GAUDI_FORCE_AUTOCAST": "1", "ACCEL_GAUDI_AUTOCAST_POLICY": "always"}, "no", [], BF16_AUTOCAST),
        ({"ACCEL_GAUDI_FP8": "1", "ACCEL_GAUDI_FORCE_AUTOCAST": "1"}, "bf16", FP8_MODULES, FP8_UNDER_BF16_AUTOCAST),
        ({"ACCEL_GAUDI_FP8": "1"}, "no", FP8_MODULES, FP8),
    ],
    ids=["bf16", "bf16-force_autocast", "no-always-force_autocast", "bf16-fp8_option-force_autocast", "no-fp8_option"],
)
def test_autocast_rule_and_fp8_option_are_unchanged(monkeypatch, env, mixed_precision, modules, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    acc, converted, losses = run(mixed_precision, gradient_checkpointing=True)
    assert type(acc.precision) is GaudiPrecision
    assert converted == modules
    assert_losses(losses, expected)


def test_fp8_conversion_is_the_precision_classs():
    from accel.prepare.context import RunContext
    from accel.strategies.ddp import DDPStrategy

    model = nn.Sequential(nn.Linear(2, 2))
    adapter = GaudiAdapter(emulate=True)
    ctx = RunContext(device=torch.device("cpu"), device_placement=False, strategy=DDPStrategy(), adapter=adapter)
    converted = GaudiPrecision("fp8", adapter).convert_fp8(model, ctx)
    assert converted is model and hpu_emulated.is_fp8_linear(model[0]) and model._accel_fp8_recipe is not None
