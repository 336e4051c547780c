"""fp8 training on NVIDIA GPUs through TransformerEngine or torchao, whichever is installed.

TransformerEngine: every eligible `nn.Linear` becomes a `te.Linear` (same Parameters) and the
forward runs inside `te.fp8_autocast` with a `DelayedScaling` recipe (`TERecipeKwargs`).
torchao: `convert_to_float8_training` swaps eligible Linears for `Float8Linear`
(`AORecipeKwargs`). Either way the rest of the model runs under bf16 autocast.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from accel.errors import AccelError
from accel.settings.kwargs import KwargsHandler

FP8_BACKENDS = ("te", "ao")
TE_FORMATS = ("HYBRID", "E4M3", "E5M2")
TE_AMAX_ALGOS = ("max", "most_recent")


class FP8BackendError(AccelError, RuntimeError):
    """fp8 was asked for but cannot run here (no library, or a GPU without fp8 tensor cores)."""


@dataclass(kw_only=True)
class TERecipeKwargs(KwargsHandler):
    """TransformerEngine's delayed-scaling recipe; passing it selects the TransformerEngine backend.

    Each fp8 tensor is scaled by `fp8_max / amax / 2**margin`, with `amax` from the history of
    earlier steps (no extra pass over the tensor before each matmul).
    """

    fp8_format: str = "HYBRID"
    """"HYBRID": E4M3 forward (more mantissa), E5M2 gradients (more range); or "E4M3"/"E5M2" throughout."""
    margin: int = 0
    """Headroom below the format's maximum, in powers of two."""
    interval: int = 1
    """Recompute the scales every this many steps."""
    amax_history_len: int = 1024
    """Steps of amax remembered; longer is steadier, slower to follow a shrinking range."""
    amax_compute_algo: str = "most_recent"
    """"most_recent" amax, or the "max" over the history (safer with spikes)."""
    use_autocast_during_eval: bool = False
    """Also compute in fp8 when the model is in eval mode (off: evaluation runs in bf16)."""

    def __post_init__(self) -> None:
        self.fp8_format = self.fp8_format.upper()
        if self.fp8_format not in TE_FORMATS:
            raise ValueError(f"fp8_format must be one of {TE_FORMATS}, got {self.fp8_format!r}.")
        if self.amax_compute_algo not in TE_AMAX_ALGOS:
            raise ValueError(f"amax_compute_algo must be one of {TE_AMAX_ALGOS}, got {self.amax_compute_algo!r}.")
        if self.interval < 1 or self.amax_history_len < 1:
            raise ValueError(
                f"interval and amax_history_len must be >= 1, got {self.interval} and {self.amax_history_len}."
            )

    def recipe(self, vendor: ModuleType) -> Any:
        return vendor.te_recipe(
            fp8_format=self.fp8_format,
            margin=self.margin,
            interval=self.interval,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
        )


@dataclass(kw_only=True)
class AORecipeKwargs(KwargsHandler):
    """torchao float8 training options; passing it selects the torchao backend."""

    config: Any = None
    """A `torchao.float8.Float8LinearConfig`; None takes torchao's default (tensorwise dynamic scaling)."""
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None
    """`(module, fqn) -> bool`: which Linears to convert. None: every Linear whose dimensions are
    multiples of 16 except the first and the last (the most precision-sensitive)."""


def divisible_by_16(module: torch.nn.Module) -> bool:
    """fp8 GEMMs (`torch._scaled_mm`, cuBLASLt) need both matrix dimensions to be multiples of 16."""
    weight = getattr(module, "weight", None)
    return weight is not None and all(d % 16 == 0 for d in weight.shape)


def default_ao_filter(model: torch.nn.Module) -> Callable[[torch.nn.Module, str], bool]:
    """Skip the first and last Linear of `model` and any whose shape fp8 GEMMs cannot take."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    edges = {names[0], names[-1]} if len(names) > 2 else set()

    def keep(module: torch.nn.Module, fqn: str) -> bool:
        return fqn not in edges and divisible_by_16(module)

    return keep


def choose_backend(vendor: ModuleType, te: TERecipeKwargs | None, ao: AORecipeKwargs | None) -> str:
    """Return "te" or "ao": the one the handlers or `ACCEL_FP8_BACKEND` name, else whichever is installed
    (TransformerEngine first).

    Raises:
        FP8BackendError: the named library is not installed, neither is, or the GPU has no fp8.
        ValueError: both handlers were passed, or `ACCEL_FP8_BACKEND` names no backend.
    """
    ok, device = vendor.fp8_hardware_supported()
    if not ok:
        raise FP8BackendError(
            f"mixed_precision='fp8' needs fp8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
            f"Blackwell); this GPU is {device}. Use mixed_precision='bf16' instead."
        )
    if te is not None and ao is not None:
        raise ValueError("Pass either TERecipeKwargs or AORecipeKwargs, not both: each selects an fp8 backend.")
    installed = {"te": vendor.has_transformer_engine(), "ao": vendor.has_torchao()}
    wanted = "te" if te is not None else "ao" if ao is not None else os.environ.get("ACCEL_FP8_BACKEND", "").lower()
    if wanted and wanted not in FP8_BACKENDS:
        raise ValueError(f"ACCEL_FP8_BACKEND must be one of {FP8_BACKENDS}, got {wanted!r}.")
    if wanted:
        if not installed[wanted]:
            lib, extra = ("TransformerEngine", "te") if wanted == "te" else ("torchao", "ao")
            raise FP8BackendError(
                f"The {lib} fp8 backend was selected but {lib} is not installed. "
                f"Install it with `pip install accel-cuda[{extra}]`."
            )
        return wanted
    for name in FP8_BACKENDS:
        if installed[name]:
            return name
    raise FP8BackendError(
        "mixed_precision='fp8' on CUDA needs an fp8 training library and neither is installed: "
        "NVIDIA TransformerEngine (`pip install accel-cuda[te]`) or torchao (`pip install accel-cuda[ao]`). "
        "Install one of them, or use mixed_precision='bf16'."
    )


def convert_te(model: torch.nn.Module, vendor: ModuleType) -> int:
    """Swap every eligible `nn.Linear` for the vendor's TransformerEngine Linear, in place."""
    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and divisible_by_16(child):
                setattr(parent, name, vendor.te_linear(child))
                converted += 1
    return converted
