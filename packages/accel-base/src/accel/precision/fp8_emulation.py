"""fp8 training emulated on any device: real fp8 rounding, full-precision matmuls.

Hardware-neutral, for adapters whose fp8 libraries cannot run here (their emulated vendor
modules build on it). A `Float8Linear` quantises its input and weight to `float8_e4m3fn`
(or `e5m2`) in forward and its output gradient to `float8_e5m2` in backward, each with a
per-tensor scale, then dequantises and multiplies in fp32. Numerics therefore differ from
fp32 the way fp8 training does (values rounded to 3 or 2 mantissa bits, saturated to the
format's range), while the speed is that of fp32.

Two scalings, as the real libraries have them: "dynamic" (the scale comes from this
tensor's own amax: torchao's default) and "delayed" (from the amax of earlier steps,
recomputed every `interval` steps: TransformerEngine's `DelayedScaling`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

FORMATS: dict[str, tuple[torch.dtype, torch.dtype]] = {
    # format: (forward dtype for inputs and weights, backward dtype for output gradients)
    "E4M3": (torch.float8_e4m3fn, torch.float8_e4m3fn),
    "E5M2": (torch.float8_e5m2, torch.float8_e5m2),
    "HYBRID": (torch.float8_e4m3fn, torch.float8_e5m2),
}
SCALINGS = ("dynamic", "delayed")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")


@dataclass(kw_only=True, frozen=True)
class Float8Recipe:
    """How an emulated fp8 layer scales its tensors."""

    fp8_format: str = "HYBRID"
    """"HYBRID": E4M3 forward, E5M2 gradients; "E4M3" or "E5M2": one format throughout."""
    scaling: str = "dynamic"
    """"dynamic": scale by this tensor's amax; "delayed": by the amax history of earlier steps."""
    margin: int = 0
    """Headroom below the format's maximum, in powers of two."""
    interval: int = 1
    """Delayed scaling: recompute scales every this many steps."""
    amax_history_len: int = 1
    """Delayed scaling: how many steps of amax are remembered."""
    amax_compute_algo: str = "most_recent"
    """Delayed scaling: "most_recent" amax, or the "max" over the history."""

    def __post_init__(self) -> None:
        if self.fp8_format not in FORMATS:
            raise ValueError(f"fp8_format must be one of {sorted(FORMATS)}, got {self.fp8_format!r}.")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {self.scaling!r}.")
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_COMPUTE_ALGOS}, got {self.amax_compute_algo!r}.")
        if self.interval < 1 or self.amax_history_len < 1:
            raise ValueError(
                f"interval and amax_history_len must be >= 1, got {self.interval} and {self.amax_history_len}."
            )


def quantize(tensor: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round-trip through fp8: scale, saturate to the format's range, cast, cast back, unscale."""
    fmax = torch.finfo(dtype).max
    scaled = (tensor.float() * scale).clamp(-fmax, fmax)
    return (scaled.to(dtype).float() / scale).to(tensor.dtype)


class ScalingState:
    """The scale of one tensor role (input, weight or output gradient) of one layer."""

    def __init__(self) -> None:
        self.history: list[torch.Tensor] = []
        self.scale: torch.Tensor | None = None
        self.steps = 0

    def scale_for(self, tensor: torch.Tensor, dtype: torch.dtype, recipe: Float8Recipe) -> torch.Tensor:
        amax = tensor.detach().abs().max().float()
        if recipe.scaling == "dynamic":
            ref = amax
        elif self.scale is None or self.steps % recipe.interval == 0:
            # The first step has no history: it scales by its own amax.
            past = self.history or [amax]
            ref = torch.stack(past).max() if recipe.amax_compute_algo == "max" else past[-1]
        else:
            ref = None
        if ref is not None:
            ref = torch.where(ref > 0, ref, torch.ones_like(ref))
            self.scale = torch.finfo(dtype).max / ref / (2.0**recipe.margin)
        self.history = [*self.history, amax][-recipe.amax_history_len :]
        self.steps += 1
        assert self.scale is not None
        return self.scale


_active: list[Float8Recipe] = []


@contextlib.contextmanager
def fp8_autocast(recipe: Float8Recipe) -> Iterator[None]:
    """Inside, `Float8Linear`s built without a recipe compute in fp8 with `recipe`."""
    _active.append(recipe)
    try:
        yield
    finally:
        _active.pop()


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, module: Float8Linear, recipe: Float8Recipe
    ) -> torch.Tensor:
        fwd, _ = FORMATS[recipe.fp8_format]
        xq = quantize(x, module.scaling["input"].scale_for(x, fwd, recipe), fwd)
        wq = quantize(weight, module.scaling["weight"].scale_for(weight, fwd, recipe), fwd)
        ctx.save_for_backward(xq, wq)
        ctx.module, ctx.recipe = module, recipe
        return xq @ wq.t()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        _, bwd = FORMATS[ctx.recipe.fp8_format]
        gq = quantize(grad_out, ctx.module.scaling["grad_output"].scale_for(grad_out, bwd, ctx.recipe), bwd)
        grad_x = gq @ wq
        grad_w = gq.reshape(-1, gq.shape[-1]).t() @ xq.reshape(-1, xq.shape[-1])
        return grad_x, grad_w, None, None


class Float8Linear(nn.Module):
    """An `nn.Linear` stand-in computing in emulated fp8, holding the original layer's Parameters.

    With a `recipe` it always computes in fp8 (torchao's way); without one, only inside
    `fp8_autocast` and in full precision elsewhere (TransformerEngine's way).
    """

    def __init__(self, linear: nn.Linear, *, recipe: Float8Recipe | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.recipe = recipe
        self.scaling = {role: ScalingState() for role in ("input", "weight", "grad_output")}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        recipe = self.recipe or (_active[-1] if _active else None)
        if recipe is None:
            return nn.functional.linear(x, self.weight, self.bias)
        # Autocast would re-cast the dequantised operands; fp8 is the compute precision here.
        with torch.autocast(x.device.type, enabled=False):
            out = _Float8Matmul.apply(x.float(), self.weight.float(), self, recipe)
            if self.bias is not None:
                out = out + self.bias.float()
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        mode = self.recipe.scaling if self.recipe is not None else "inside fp8_autocast"
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8=emulated ({mode})"


def swap_linears(model: nn.Module, make: Any, module_filter_fn: Any = None) -> int:
    """Replace every `nn.Linear` below `model` (for which `module_filter_fn(module, fqn)` holds)
    with `make(linear)`, in place; returns how many were replaced."""
    swapped = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            fqn = f"{parent_name}.{name}" if parent_name else name
            if type(child) is nn.Linear and (module_filter_fn is None or module_filter_fn(child, fqn)):
                setattr(parent, name, make(child))
                swapped += 1
    return swapped
