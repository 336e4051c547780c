"""Every call this package makes into Habana's software stack, and nothing else.

This module is imported only when the adapter runs on a Gaudi machine; it imports
`habana_frameworks` at the top, so importing it anywhere else fails at once (which is how
`GaudiAdapter.availability` learns that no Gaudi stack is installed). Under emulation
`accel_gaudi.hpu_emulated` replaces it function for function: keep the two in step.
"""

from __future__ import annotations

import sys
from typing import Any

import habana_frameworks.torch.core as htcore
import habana_frameworks.torch.hpu  # noqa: F401  (registers `torch.hpu`)
import torch
from habana_frameworks.torch.utils.internal import is_lazy as _is_lazy

COMPILE_BACKEND = "hpu_backend"
"""The torch.compile backend Habana registers for HPU graphs."""

# Present once habana_frameworks is imported; torch's own stubs do not know it.
_hpu: Any = torch.hpu  # type: ignore[attr-defined]

ALLREDUCE_DTYPE = torch.bfloat16
"""fast_ddp reduces gradients in bf16: half the bytes over the HCCL links, the precision
Gaudi's own fast path uses."""


def is_available() -> bool:
    return bool(_hpu.is_available())


def device_count() -> int:
    return int(_hpu.device_count())


def init_distributed() -> None:
    """Register the `hccl` backend with torch.distributed (an import side effect)."""
    import habana_frameworks.torch.distributed.hccl  # noqa: F401


def device_name() -> str:
    """The Gaudi generation: "GAUDI" (Gaudi1), "GAUDI2", "GAUDI3"."""
    return str(_hpu.get_device_name()).upper()


def is_lazy() -> bool:
    """Whether the bridge runs in lazy mode (`PT_HPU_LAZY_MODE=1`), where graphs run at `mark_step`."""
    return bool(_is_lazy())


def mark_step() -> None:
    """Cut the accumulated lazy graph here and launch it on the device."""
    htcore.mark_step()


def autocast_lists_loaded() -> bool:
    """Whether the bridge has read its autocast op lists: it reads `PT_HPU_AUTOCAST_*_OPS_LIST` once, when
    `habana_frameworks.torch.core` loads (which importing this module did)."""
    return "habana_frameworks.torch.core" in sys.modules


def autocast(context: Any) -> Any:
    """`torch.autocast("hpu", ...)` as it is: Habana's autocast applies its op lists itself."""
    return context


def get_rng_state() -> torch.Tensor:
    return _hpu.random.get_rng_state()


def set_rng_state(state: torch.Tensor) -> None:
    _hpu.random.set_rng_state(state)


def manual_seed(seed: int) -> None:
    _hpu.random.manual_seed_all(seed)


def module_cacher(model: torch.nn.Module) -> torch.nn.Module:
    """Habana's `ModuleCacher` on `model`, in place: its forward and backward are recorded once as HPU
    graphs and replayed on later calls."""
    import habana_frameworks.torch as ht

    ht.hpu.ModuleCacher()(model=model, inplace=True)
    return model


def hpu_graph(fn: Any) -> Any:
    """Record `fn` once as an HPU graph (captured on a side stream) and return its replay: each replay repeats
    the recorded work on the tensors `fn` touched while it was recorded."""
    import habana_frameworks.torch as ht

    graph = ht.hpu.HPUGraph()
    with ht.hpu.stream(ht.hpu.Stream()):
        graph.capture_begin()
        fn()
        graph.capture_end()
    return graph.replay


def _te() -> Any:
    from habana_frameworks.torch.hpex.experimental import transformer_engine

    return transformer_engine


def make_fp8_recipe(
    *,
    fp8_format: str,
    margin: int,
    interval: int,
    amax_history_len: int,
    amax_compute_algo: str,
    reduce_amax: bool,
) -> Any:
    """A transformer-engine `DelayedScaling` recipe (`fp8_format` is "E5M2" or "HYBRID")."""
    te = _te()
    return te.recipe.DelayedScaling(
        fp8_format=getattr(te.recipe.Format, fp8_format),
        margin=margin,
        interval=interval,
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
        reduce_amax=reduce_amax,
    )


def fp8_linear(linear: torch.nn.Linear, *, minimize_memory: bool = False) -> torch.nn.Module:
    """A transformer-engine Linear that shares `linear`'s weight and bias Parameters."""
    module = _te().Linear(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        params_dtype=linear.weight.dtype,
        skip_weight_param_allocation=True,
        minimize_memory=minimize_memory,
    )
    module.weight = linear.weight
    if linear.bias is not None:
        module.bias = linear.bias
    return module


def is_fp8_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, _te().Linear)


def fp8_autocast(recipe: Any) -> Any:
    """Context in which transformer-engine layers compute in fp8 with `recipe`."""
    return _te().fp8_autocast(enabled=True, fp8_recipe=recipe)


def fp8_fused_attention(*, scale: float | None, attention_dropout: float, enable_recompute: bool) -> torch.nn.Module:
    """transformer engine's fp8 fused SDPA kernel."""
    return _te().FusedAttention(scale=scale, attention_dropout=attention_dropout, enable_recompute=enable_recompute)


def activation_checkpointing(function: Any, recipe: Any) -> Any:
    """`function` marked for transformer engine's activation checkpointing, so its recompute
    during backward runs with the forward's fp8 state."""
    return _te().distributed.activation_checkpointing()(function)


def fused_optimizers() -> tuple[Any, Any]:
    """(FusedAdamW, FusedClipNorm) from hpex, or (None, None) where this stack lacks them."""
    try:
        from habana_frameworks.torch.hpex.normalization import FusedClipNorm
        from habana_frameworks.torch.hpex.optimizers import FusedAdamW
    except ImportError:
        return None, None
    return FusedAdamW, FusedClipNorm
