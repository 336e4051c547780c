"""The CPU stand-in for `accel_gaudi.hpu`: same functions, no Habana software.

Calls that only matter on the device (step markers, backend registration, seeding) are
counted in `calls`, so tests can assert where the adapter makes them. The fp8 pieces
stand for Habana's transformer engine: a Linear that really quantises its input, weight
and output gradient to `torch.float8_e4m3fn` / `torch.float8_e5m2` with per-tensor
delayed scaling, so numerics differ from fp32 the way fp8 training does.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

COMPILE_BACKEND = "inductor"
"""hpu_backend exists only with the Habana bridge; inductor is torch's own CPU compiler."""

ALLREDUCE_DTYPE = torch.float32
"""fp32, not the hardware's bf16: under emulation fast_ddp must match DDP's fp32 reduction
on gloo to within float rounding, so tests can tell a wrong reduction from bf16 noise."""

calls: Counter[str] = Counter()
"""How many times each device-only call was made (reset it between tests)."""


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def init_distributed() -> None:
    calls["init_distributed"] += 1


def is_lazy() -> bool:
    """Lazy mode as Habana's bridge reads it: `PT_HPU_LAZY_MODE`, on unless set to 0."""
    return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"


def mark_step() -> None:
    calls["mark_step"] += 1


def get_rng_state() -> None:
    # The emulated device draws from the host generator, which accel already saves.
    return None


def set_rng_state(state: Any) -> None:
    return None


def manual_seed(seed: int) -> None:
    calls["manual_seed"] += 1


# ---- fp8: stands for habana_frameworks.torch.hpex.experimental.transformer_engine ----------

_FORMATS = {
    # format: (forward dtype for inputs and weights, backward dtype for output gradients)
    "E5M2": (torch.float8_e5m2, torch.float8_e5m2),
    "HYBRID": (torch.float8_e4m3fn, torch.float8_e5m2),
}


@dataclass(kw_only=True, frozen=True)
class DelayedScaling:
    """Stands for `transformer_engine.recipe.DelayedScaling`."""

    fp8_format: str
    margin: int
    interval: int
    amax_history_len: int
    amax_compute_algo: str
    reduce_amax: bool


def make_fp8_recipe(**kwargs: Any) -> DelayedScaling:
    return DelayedScaling(**kwargs)


_active: list[DelayedScaling] = []


@contextlib.contextmanager
def fp8_autocast(recipe: DelayedScaling) -> Iterator[None]:
    """Inside, fp8 Linears quantise with `recipe`; outside they compute in full precision."""
    _active.append(recipe)
    try:
        yield
    finally:
        _active.pop()


def quantize(tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round-trip through fp8: scale, saturate to the format's range, cast, cast back, unscale."""
    fmax = torch.finfo(dtype).max
    scaled = (tensor.float() * scale).clamp(-fmax, fmax)
    return (scaled.to(dtype).float() / scale).to(tensor.dtype)


class _ScalingState:
    """Delayed scaling for one tensor role: the scale comes from the amax of earlier steps."""

    def __init__(self) -> None:
        self.history: list[torch.Tensor] = []
        self.scale: torch.Tensor | None = None
        self.steps = 0

    def scale_for(self, tensor: torch.Tensor, dtype: torch.dtype, recipe: DelayedScaling) -> torch.Tensor:
        amax = tensor.detach().abs().max().float()
        if self.scale is None or self.steps % recipe.interval == 0:
            # The first step has no history: it scales by its own amax.
            past = self.history or [amax]
            ref = torch.stack(past).max() if recipe.amax_compute_algo == "max" else past[-1]
            ref = torch.where(ref > 0, ref, torch.ones_like(ref))
            self.scale = torch.finfo(dtype).max / ref / (2.0**recipe.margin)
        self.history = [*self.history, amax][-recipe.amax_history_len :]
        self.steps += 1
        return self.scale


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, module: Linear
    ) -> torch.Tensor:
        recipe = _active[-1]
        fwd, _ = _FORMATS[recipe.fp8_format]
        xq = quantize(x, module.scaling["input"].scale_for(x, fwd, recipe), fwd)
        wq = quantize(weight, module.scaling["weight"].scale_for(weight, fwd, recipe), fwd)
        ctx.save_for_backward(xq, wq)
        ctx.has_bias = bias is not None
        ctx.module, ctx.recipe = module, recipe
        out = xq @ wq.t()
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        _, bwd = _FORMATS[ctx.recipe.fp8_format]
        gq = quantize(grad_out, ctx.module.scaling["grad_output"].scale_for(grad_out, bwd, ctx.recipe), bwd)
        grad_x = gq @ wq
        grad_w = gq.reshape(-1, gq.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
        grad_b = grad_out.reshape(-1, grad_out.shape[-1]).sum(0) if ctx.has_bias else None
        return grad_x, grad_w, grad_b, None


class Linear(nn.Module):
    """Stands for transformer engine's `Linear`: fp8 compute inside `fp8_autocast`, plain outside."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # Weights are attached afterwards (the vendor's skip_weight_param_allocation=True).
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None
        self.scaling = {role: _ScalingState() for role in ("input", "weight", "grad_output")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.weight is not None
        if not _active:
            return nn.functional.linear(x, self.weight, self.bias)
        # Autocast would re-cast the dequantised operands; fp8 is the compute precision here.
        with torch.autocast(x.device.type, enabled=False):
            bias = self.bias.float() if self.bias is not None else None
            out = _Fp8LinearFunction.apply(x.float(), self.weight.float(), bias, self)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=emulated"


def fp8_linear(linear: nn.Linear) -> nn.Module:
    module = Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    module.weight = cast(nn.Parameter, linear.weight)
    if linear.bias is not None:
        module.bias = cast(nn.Parameter, linear.bias)
    return module


def is_fp8_linear(module: nn.Module) -> bool:
    return isinstance(module, Linear)
