"""fp8 on Gaudi: Linear layers become Habana transformer-engine Linears with a delayed-scaling recipe."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from accel.errors import FP8RecipeError
from accel.precision.fp8_request import FP8Request
from accel.settings.kwargs import KwargsHandler

FP8_FORMATS = ("E5M2", "HYBRID")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")


@dataclass(kw_only=True)
class GaudiFP8RecipeKwargs(KwargsHandler):
    """The delayed-scaling recipe for fp8 training. Pass it in `Accelerator(kwargs_handlers=[...])`.

    Each fp8 tensor is scaled by `fp8_max / amax / 2**margin`, with `amax` taken from the
    history of earlier steps (delayed scaling: no extra pass over the tensor before the matmul).
    """

    fp8_format: str = "HYBRID"
    """"HYBRID": E4M3 (more mantissa) for activations and weights in forward, E5M2 (more
    range) for gradients in backward. "E5M2": E5M2 everywhere (wider range, coarser values)."""
    margin: int = 0
    """Extra headroom, in powers of two, below the format's maximum."""
    interval: int = 16
    """Recompute the scales every this many steps; in between the last scales are reused."""
    amax_history_len: int = 1
    """How many steps of amax are remembered."""
    amax_compute_algo: str = "most_recent"
    """"most_recent": the last step's amax; "max": the largest in the history (safer with spikes)."""
    reduce_amax: bool = False
    """All-reduce amax across processes so every rank uses the same scales (off by default, as
    in Gaudi's `GaudiTERecipeKwargs`)."""

    def __post_init__(self) -> None:
        self.fp8_format = self.fp8_format.upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8_format must be one of {FP8_FORMATS} on Gaudi, got {self.fp8_format!r}.")
        if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {AMAX_COMPUTE_ALGOS}, got {self.amax_compute_algo!r}.")
        if self.interval < 1 or self.amax_history_len < 1:
            raise ValueError(
                f"interval and amax_history_len must be >= 1, got {self.interval} and {self.amax_history_len}."
            )

    def recipe(self, vendor: ModuleType) -> Any:
        """The vendor's `DelayedScaling` object for these settings."""
        return vendor.make_fp8_recipe(
            fp8_format=self.fp8_format,
            margin=self.margin,
            interval=self.interval,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
            reduce_amax=self.reduce_amax,
        )


def recipe_from_request(request: FP8Request) -> tuple[GaudiFP8RecipeKwargs, bool | None]:
    """Gaudi's recipe for Accelerate's recipe handlers and the launcher's fp8 settings (`RunContext.fp8`), field
    for field over Gaudi's defaults, and their `use_autocast_during_eval` (None: not given). What Habana's
    transformer engine cannot run is refused by name.

    Raises:
        FP8RecipeError: the torchao or MS-AMP backend, an E4M3-only format, MXFP8 block scaling or
            higher-precision GEMMs, naming the setting.
    """
    if request.backend in ("ao", "msamp"):
        lib = "torchao float8 training" if request.backend == "ao" else "MS-AMP"
        raise FP8RecipeError(
            f"{request.backend_source} = {request.backend!r}: {lib} does not run on Gaudi; fp8 there is Habana's "
            "transformer engine (TERecipeKwargs or FP8RecipeKwargs(backend='TE'))."
        )
    request.refuse_unless(
        "fp8_format", FP8_FORMATS, "Gaudi runs fp8 as HYBRID or E5M2 (its transformer engine has no E4M3-only recipe)."
    )
    request.refuse_unless("use_mxfp8_block_scaling", (False,), "MXFP8 block scaling is not available on HPU.")
    request.refuse_unless(
        "override_linear_precision",
        ((False, False, False),),
        "accel-gaudi runs every GEMM of Habana's fp8 Linear in fp8; drop it.",
    )
    fields = ("fp8_format", "margin", "interval", "amax_history_len", "amax_compute_algo")
    try:
        recipe = GaudiFP8RecipeKwargs(**{k: v for k, v in request.given("te").items() if k in fields})
    except ValueError as e:
        raise FP8RecipeError(f"{request.backend_source or 'the launcher ACCEL_FP8_* settings'}: {e}") from None
    return recipe, request.settings.get("use_autocast_during_eval")


def _minimize_memory() -> bool:
    value = os.environ.get("PT_HPU_FP8_MINIMIZE_MEMORY", "false").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"PT_HPU_FP8_MINIMIZE_MEMORY must be true or false, got {value!r}.")
    return value in _TRUE


_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f", "")


def _is_lora_linear(module: torch.nn.Module) -> bool:
    # peft's `lora.Linear` (matched by structure, so peft need not be installed): its frozen
    # `base_layer` plus the small adapters `lora_A` / `lora_B`.
    return isinstance(getattr(module, "base_layer", None), torch.nn.Linear) and hasattr(module, "lora_A")


def _is_fp8_fused_sdpa(module: torch.nn.Module) -> bool:
    # optimum-habana's `ModuleFusedSDPA` built with `flash_attention_fp8=True`.
    return type(module).__name__ == "ModuleFusedSDPA" and bool(getattr(module, "flash_attention_fp8", False))


class _FP8FusedSDPA(torch.nn.Module):
    """Replaces `ModuleFusedSDPA`: the same call, computed by the vendor's fp8 `FusedAttention`
    with the replaced module's scale and dropout (the per-call `dropout_p`/`scale` are ignored,
    as Gaudi's conversion does)."""

    def __init__(self, module: torch.nn.Module, vendor: ModuleType) -> None:
        super().__init__()
        self._hpu_kernel_fsdpa = vendor.fp8_fused_attention(
            scale=module.scale,
            attention_dropout=module.attention_dropout,
            enable_recompute=getattr(module, "enable_recompute", False),
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Any,
        dropout_p: float,
        is_causal: bool,
        scale: Any,
        softmax_mode: Any,
        recompute_mode: Any = None,
        valid_sequence_lengths: Any = None,
        padding_side: str = "left",
    ) -> torch.Tensor:
        return self._hpu_kernel_fsdpa(query, key, value, attn_mask, is_causal, softmax_mode)


def convert_linears(model: torch.nn.Module, vendor: ModuleType) -> int:
    """Replace the `nn.Linear` layers below `model` with the vendor's fp8 Linear, in place, the
    way Gaudi's `convert_model` does.

    The new layers hold the same Parameter objects, so an optimizer built on the original
    model keeps updating them. In a LoRA layer only the `base_layer` is converted (the small
    `lora_A`/`lora_B` adapters stay plain). An fp8 `ModuleFusedSDPA` becomes the vendor's
    fp8 `FusedAttention`. `PT_HPU_FP8_MINIMIZE_MEMORY=true` reaches the vendor layers.
    Returns how many modules were converted.
    """
    minimize_memory = _minimize_memory()
    converted = 0
    for name, child in list(model.named_children()):
        if _is_lora_linear(child):
            child.base_layer = vendor.fp8_linear(child.base_layer, minimize_memory=minimize_memory)
            converted += 1
        elif isinstance(child, torch.nn.Linear):
            setattr(model, name, vendor.fp8_linear(child, minimize_memory=minimize_memory))
            converted += 1
        elif _is_fp8_fused_sdpa(child):
            setattr(model, name, _FP8FusedSDPA(child, vendor))
            converted += 1
        else:
            converted += convert_linears(child, vendor)
    return converted


def wrap_gradient_checkpointing(model: torch.nn.Module, vendor: ModuleType, recipe: Any) -> int:
    """Make the recompute of every gradient-checkpointed block run in fp8 as its forward did.

    `transformers` models with `gradient_checkpointing` on call `module._gradient_checkpointing_func(block, ...)`;
    the block is wrapped with the vendor's `activation_checkpointing` (as Gaudi's Accelerator does). Returns
    how many modules were wrapped; call it after `gradient_checkpointing_enable()`.
    """
    wrapped = 0
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if getattr(module, "gradient_checkpointing", False) and func is not None:
            if getattr(func, "_accel_fp8_recompute", False):
                continue

            def checkpointed(function: Any, *args: Any, _inner: Any = func, **kwargs: Any) -> Any:
                return _inner(vendor.activation_checkpointing(function, recipe), *args, **kwargs)

            checkpointed._accel_fp8_recompute = True  # type: ignore[attr-defined]
            module._gradient_checkpointing_func = checkpointed  # type: ignore[assignment]
            wrapped += 1
    return wrapped
