"""The CPU stand-in for `accel_gaudi.hpu`: same functions, no Habana software.

Calls that only matter on the device (step markers, backend registration, seeding) are
counted in `calls`, so tests can assert where the adapter makes them. The fp8 pieces
stand for Habana's transformer engine with the core's `accel.precision.fp8_emulation`: a Linear that
really quantises its input, weight and output gradient to `torch.float8_e4m3fn` /
`torch.float8_e5m2` with per-tensor delayed scaling, so numerics differ from fp32 the way
fp8 training does.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from accel.precision import fp8_emulation as f8
from accel.testing.emulated import DeviceGenerators
from torch import nn
from torch.overrides import TorchFunctionMode

from .autocast_ops import declared_lists

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


def device_name() -> str:
    """The Gaudi generation as `torch.hpu.get_device_name()` reports it ("GAUDI", "GAUDI2", "GAUDI3").

    Emulated: `ACCEL_GAUDI_EMULATED_DEVICE` (default "GAUDI2"), so tests can stand for a Gaudi1."""
    return os.environ.get("ACCEL_GAUDI_EMULATED_DEVICE", "GAUDI2").upper()


def is_lazy() -> bool:
    """Lazy mode as Habana's bridge reads it: `PT_HPU_LAZY_MODE`, on unless set to 0."""
    return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"


def mark_step() -> None:
    calls["mark_step"] += 1


# ---- autocast: stands for Habana's HPU autocast and its op lists ---------------------------------

_op_lists: list[tuple[frozenset[str], frozenset[str]] | None] = []
"""The op lists as the bridge read them, once (empty: not read yet; [None]: none declared, torch's CPU lists)."""


def _read_op_lists() -> tuple[frozenset[str], frozenset[str]] | None:
    if not _op_lists:
        declared = declared_lists(os.environ)
        _op_lists.append(None if declared is None else (frozenset(declared[0]), frozenset(declared[1])))
    return _op_lists[0]


def autocast_lists_loaded() -> bool:
    """Whether the emulated bridge has read `PT_HPU_AUTOCAST_*_OPS_LIST` (at its first autocast; the real one
    reads them when it loads)."""
    return bool(_op_lists)


def autocast(context: Any) -> Any:
    """Habana's autocast for `context` (a `torch.autocast` on the CPU). With declared op lists, ops in the bf16
    list run in the autocast dtype, ops in the fp32 list in fp32 and the rest in their inputs' dtype (the lists
    replace the defaults, as on the device); without, torch's CPU autocast stands for Habana's default lists."""
    lists = _read_op_lists()
    if lists is None:
        return context
    return OpListAutocast(context.fast_dtype, lower=lists[0], fp32=lists[1])


class OpListAutocast(TorchFunctionMode):
    """Autocast by op name: each torch function or tensor method called under it is looked up by its name
    (dunders stripped: `__truediv__` is "truediv", `__iadd__` "iadd"); the floating-point tensors it takes are
    cast to `dtype` for a name in `lower`, to fp32 for a name in `fp32`. An in-place op keeps its own tensor."""

    def __init__(self, dtype: torch.dtype, *, lower: frozenset[str], fp32: frozenset[str]) -> None:
        super().__init__()
        self.dtype, self.lower, self.fp32 = dtype, lower, fp32

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        raw = getattr(func, "__name__", "")
        name = raw.strip("_")
        target = self.dtype if name in self.lower else torch.float32 if name in self.fp32 else None
        if target is not None:
            dunder = raw.startswith("__") and raw.endswith("__")
            in_place = raw.startswith("__i") if dunder else raw.endswith("_")
            head, rest = (args[:1], args[1:]) if in_place else ((), args)
            args = (*head, *(_cast(a, target) for a in rest))
            kwargs = {k: _cast(v, target) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != torch.float64 else value
    if type(value) in (list, tuple):
        return type(value)(_cast(v, dtype) for v in value)
    return value


_rng = DeviceGenerators(1)  # one HPU per process


def generator(index: int = 0) -> torch.Generator:
    """The emulated HPU's generator (the conformance kit's device dropout draws from it)."""
    return _rng.generator(index)


def get_rng_state() -> list[torch.Tensor]:
    return _rng.get_rng_state()


def set_rng_state(state: list[torch.Tensor]) -> None:
    _rng.set_rng_state(state)


def manual_seed(seed: int) -> None:
    calls["manual_seed"] += 1
    _rng.manual_seed(seed)


def module_cacher(model: nn.Module) -> nn.Module:
    """Stands for `ht.hpu.ModuleCacher()(model=model, inplace=True)`: in place, the module's forward goes
    through the cacher (each call counted in `calls["hpu_graph_forward"]`) and computes what the replayed
    graph computes, eagerly."""
    calls["module_cacher"] += 1
    forward = model.forward

    def cached_forward(*args: Any, **kwargs: Any) -> Any:
        calls["hpu_graph_forward"] += 1
        return forward(*args, **kwargs)

    model.forward = cached_forward  # type: ignore[method-assign]
    return model


def hpu_graph(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Stands for recording `fn` as an HPU graph (`hpu.hpu_graph`): recording runs nothing (counted in
    `calls["hpu_graph_capture"]`); each replay (`calls["hpu_graph_replay"]`) repeats `fn`'s work on the tensors
    it closed over, as a recorded graph replays on the tensors it captured."""
    calls["hpu_graph_capture"] += 1

    def replay() -> Any:
        calls["hpu_graph_replay"] += 1
        return fn()

    return replay


# ---- fp8: stands for habana_frameworks.torch.hpex.experimental.transformer_engine ----------


@dataclass(kw_only=True, frozen=True)
class DelayedScaling(f8.Float8Recipe):
    """Stands for `transformer_engine.recipe.DelayedScaling`: the core's emulated recipe, delayed."""

    scaling: str = "delayed"
    reduce_amax: bool = False
    """Recorded as the vendor recipe has it; emulated ranks scale by their own amax."""


def make_fp8_recipe(**kwargs: Any) -> DelayedScaling:
    return DelayedScaling(**kwargs)


fp8_autocast = f8.fp8_autocast
"""Inside, fp8 Linears quantise with the recipe; outside they compute in full precision."""


class Linear(f8.Float8Linear):
    """Stands for transformer engine's `Linear`: fp8 compute inside `fp8_autocast`, plain outside,
    holding the converted layer's Parameters."""

    minimize_memory: bool = False
    """Recorded as the vendor layer takes it (`PT_HPU_FP8_MINIMIZE_MEMORY`); no effect on the CPU."""


def fp8_linear(linear: nn.Linear, *, minimize_memory: bool = False) -> nn.Module:
    layer = Linear(linear)
    layer.minimize_memory = minimize_memory
    return layer


class FusedAttention(nn.Module):
    """Stands for transformer engine's `FusedAttention` (fp8 fused SDPA): inside `fp8_autocast`
    query, key and value are quantised per tensor (E4M3, current amax) before the attention."""

    def __init__(self, *, scale: float | None, attention_dropout: float, enable_recompute: bool) -> None:
        super().__init__()
        self.scale, self.attention_dropout, self.enable_recompute = scale, attention_dropout, enable_recompute

    def forward(self, query: Any, key: Any, value: Any, attn_mask: Any, is_causal: bool, softmax_mode: Any) -> Any:
        if f8._active:
            fmax = torch.finfo(torch.float8_e4m3fn).max
            query, key, value = (
                f8.quantize(t, fmax / t.detach().abs().max().clamp(min=1e-12), torch.float8_e4m3fn)
                for t in (query, key, value)
            )
        dropout = self.attention_dropout if self.training else 0.0
        return nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal, scale=self.scale
        )


def fp8_fused_attention(*, scale: float | None, attention_dropout: float, enable_recompute: bool) -> nn.Module:
    return FusedAttention(scale=scale, attention_dropout=attention_dropout, enable_recompute=enable_recompute)


def activation_checkpointing(function: Any, recipe: Any) -> Any:
    """Stands for `transformer_engine.distributed.activation_checkpointing()(function)`: the emulated
    layers read the recipe from the active context, so `function` enters it itself; a recompute
    during backward (outside the forward's context) then quantises as the forward did."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with fp8_autocast(recipe):
            return function(*args, **kwargs)

    return run


def fused_optimizers() -> tuple[Any, Any]:
    """(FusedAdamW, FusedClipNorm) from `habana_frameworks.torch.hpex`: emulated, `torch.optim.AdamW`
    (Habana's fused version computes the same update) and the clip-norm stand-in below."""
    return EmulatedFusedAdamW, FusedClipNorm


class EmulatedFusedAdamW(torch.optim.AdamW):
    """Stands for `hpex.optimizers.FusedAdamW`: the same AdamW update, counted per step."""

    def step(self, closure: Any = None) -> Any:
        calls["fused_adamw_step"] += 1
        return super().step(closure)


class FusedClipNorm:
    """Stands for `hpex.normalization.FusedClipNorm(parameters, max_norm)`: `clip_norm(parameters)`
    clips to `max_norm` and returns the total norm (counted)."""

    def __init__(self, parameters: Any, max_norm: float) -> None:
        self.max_norm = max_norm

    def clip_norm(self, parameters: Any) -> torch.Tensor:
        calls["fused_clip_norm"] += 1
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm)


def is_fp8_linear(module: nn.Module) -> bool:
    return isinstance(module, Linear)


# Where the kit runs without Habana's stack (`accel_gaudi.hpu` imports habana_frameworks at the top), the public
# functions `accel_gaudi.hpu` has; the kit checks this stand-in's names against them (tests/test_conformance.py
# checks this list against hpu.py's source).
REAL_FUNCTIONS = (
    "activation_checkpointing",
    "autocast",
    "autocast_lists_loaded",
    "device_count",
    "device_name",
    "fp8_autocast",
    "fp8_fused_attention",
    "fp8_linear",
    "fused_optimizers",
    "get_rng_state",
    "hpu_graph",
    "init_distributed",
    "is_available",
    "is_fp8_linear",
    "is_lazy",
    "make_fp8_recipe",
    "manual_seed",
    "mark_step",
    "module_cacher",
    "set_rng_state",
)
