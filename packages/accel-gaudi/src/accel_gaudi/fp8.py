"""fp8 on Gaudi: Linear layers become Habana transformer-engine Linears with a delayed-scaling recipe."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from accel.kwargs import KwargsHandler

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
    reduce_amax: bool = True
    """All-reduce amax across processes so every rank uses the same scales."""

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


def convert_linears(model: torch.nn.Module, vendor: ModuleType) -> int:
    """Replace every `nn.Linear` below `model` with the vendor's fp8 Linear, in place.

    The new layers hold the same Parameter objects, so an optimizer built on the original
    model keeps updating them. Returns how many layers were converted.
    """
    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, vendor.fp8_linear(child))
                converted += 1
    return converted
