"""fp8 training on NVIDIA GPUs through TransformerEngine or torchao, whichever is installed.

TransformerEngine: every eligible `nn.Linear` becomes a `te.Linear` (same Parameters) and the
forward runs inside `te.fp8_autocast` with a `DelayedScaling` recipe (`TERecipeKwargs`).
torchao: `convert_to_float8_training` swaps eligible Linears for `Float8Linear`
(`AORecipeKwargs`). Either way the rest of the model runs under bf16 autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from accel.errors import AccelError, FP8RecipeError
from accel.precision.fp8_request import FP8Request
from accel.settings.kwargs import KwargsHandler

FP8_BACKENDS = ("te", "ao")
TE_FORMATS = ("HYBRID", "E4M3", "E5M2")
TE_AMAX_ALGOS = ("max", "most_recent")
TE_OVERRIDES = ((False, False, False), (False, False, True))


class FP8BackendError(AccelError, RuntimeError):
    """fp8 was asked for but cannot run here (no library, or a GPU without fp8 tensor cores)."""


@dataclass(kw_only=True)
class TERecipeKwargs(KwargsHandler):
    """TransformerEngine's recipe; passing it selects the TransformerEngine backend. Accelerate's
    `accel.utils.TERecipeKwargs` / `FP8RecipeKwargs` are translated into this class, field for field.

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
    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    """Run the (forward, data-gradient, weight-gradient) GEMMs in higher precision; TransformerEngine takes
    all off, or the weight gradient alone."""
    use_mxfp8_block_scaling: bool = False
    """MXFP8 block scaling (`MXFP8BlockScaling`: a scale per 32 values, computed from the tensor itself) instead
    of delayed scaling; needs a GPU with it (Blackwell), and takes no interval or amax history."""
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
        self.override_linear_precision = tuple(bool(v) for v in self.override_linear_precision)  # type: ignore[assignment]
        if self.override_linear_precision not in TE_OVERRIDES:
            raise ValueError(
                f"override_linear_precision={self.override_linear_precision}: TransformerEngine runs either every "
                "GEMM in fp8 (False, False, False) or the weight gradient alone in higher precision "
                "(False, False, True)."
            )
        if self.use_mxfp8_block_scaling:
            delayed = {"interval": 1, "amax_history_len": 1024, "amax_compute_algo": "most_recent"}
            delayed_only = [k for k, default in delayed.items() if getattr(self, k) != default]
            if self.override_linear_precision != (False, False, False):
                delayed_only.append("override_linear_precision")
            if delayed_only:
                raise ValueError(
                    f"use_mxfp8_block_scaling=True takes no {', '.join(delayed_only)}: MXFP8 block scaling computes each "
                    "scale from the tensor itself (these configure delayed scaling). Drop them."
                )

    def recipe(self, vendor: ModuleType) -> Any:
        return vendor.te_recipe(
            fp8_format=self.fp8_format,
            margin=self.margin,
            interval=self.interval,
            amax_history_len=self.amax_history_len,
            amax_compute_algo=self.amax_compute_algo,
            override_linear_precision=self.override_linear_precision,
            use_mxfp8_block_scaling=self.use_mxfp8_block_scaling,
        )


@dataclass(kw_only=True)
class AORecipeKwargs(KwargsHandler):
    """torchao float8 training options; passing it selects the torchao backend. Accelerate's
    `accel.utils.AORecipeKwargs` is translated into this class, field for field."""

    config: Any = None
    """A `torchao.float8.Float8LinearConfig`, used as it is; None: one built from the two switches below."""
    module_filter_func: Callable[[torch.nn.Module, str], bool] | None = None
    """`(module, fqn) -> bool`: which Linears to convert. None: every Linear whose dimensions are
    multiples of 16 except the first and the last (the most precision-sensitive)."""
    pad_inner_dim: bool = True
    """Pad GEMM inner dimensions to multiples of 16 (`torch._scaled_mm` needs them); on, as in Accelerate."""
    enable_fsdp_float8_all_gather: bool = True
    """Under FSDP2, all-gather weights in fp8 (half bf16's traffic) and precompute their scales after each
    optimizer step; on, as in Accelerate."""

    def float8_config(self, vendor: ModuleType) -> Any:
        """`config`, else torchao's `Float8LinearConfig` from `pad_inner_dim` and `enable_fsdp_float8_all_gather`."""
        if self.config is not None:
            return self.config
        return vendor.ao_config(
            pad_inner_dim=self.pad_inner_dim, enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather
        )


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


def from_request(
    request: FP8Request, te: TERecipeKwargs | None, ao: AORecipeKwargs | None
) -> tuple[str | None, TERecipeKwargs | None, AORecipeKwargs | None]:
    """The backend and this adapter's recipe objects for a run: its own handlers (`te`, `ao`) when given, else
    Accelerate's recipe handlers and the launcher's fp8 settings (`request`), translated field for field.

    Raises:
        ValueError: both of this adapter's handlers, or one of them with an Accelerate-named one.
        FP8RecipeError: a setting the backend cannot take (MS-AMP, a value TransformerEngine refuses),
            naming the setting.
    """
    if te is not None and ao is not None:
        raise ValueError("Pass either TERecipeKwargs or AORecipeKwargs, not both: each selects an fp8 backend.")
    own = te or ao
    if own is not None:
        if request.backend is not None and request.backend_source != "ACCEL_FP8_BACKEND":
            raise ValueError(
                f"accel_cuda.{type(own).__name__} and {request.backend_source} both choose the fp8 recipe: pass one."
            )
        return ("te" if te is not None else "ao"), te, ao
    backend = request.backend
    if backend == "msamp":
        why = "MS-AMP is not supported by accel-cuda; use the 'te' (TransformerEngine) or 'ao' (torchao) backend."
        raise FP8RecipeError(f"{request.backend_source} = 'msamp': {why}")
    try:
        te = TERecipeKwargs(**request.given("te"))
        ao = AORecipeKwargs(**request.given("ao"))
    except ValueError as e:
        where = request.backend_source or "the launcher's ACCEL_FP8_* settings"
        raise FP8RecipeError(f"{where}: {e}") from None
    return backend, te, ao


def choose_backend(vendor: ModuleType, wanted: str | None, source: str) -> str:
    """Return "te" or "ao": `wanted` (named by `source`), else whichever is installed (TransformerEngine first).

    Raises:
        FP8BackendError: the named library is not installed, or neither is.
    """
    installed = {"te": vendor.has_transformer_engine(), "ao": vendor.has_torchao()}
    if wanted:
        if not installed[wanted]:
            lib, extra = ("TransformerEngine", "te") if wanted == "te" else ("torchao", "ao")
            raise FP8BackendError(
                f"The {lib} fp8 backend was selected ({source}) but {lib} is not installed. "
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


def check_mxfp8(vendor: ModuleType, te: TERecipeKwargs, request: FP8Request) -> None:
    """MXFP8 block scaling needs a GPU that has it.

    Raises:
        FP8RecipeError: `use_mxfp8_block_scaling` on a GPU without it, naming the setting.
    """
    if not te.use_mxfp8_block_scaling:
        return
    ok, why = vendor.mxfp8_supported()
    why = str(why).rstrip(".")
    if not ok:
        if "use_mxfp8_block_scaling" in request.settings:
            raise request.refuse("use_mxfp8_block_scaling", f"MXFP8 block scaling is not available: {why}.")
        raise FP8RecipeError(
            f"TERecipeKwargs(use_mxfp8_block_scaling=True): MXFP8 block scaling is not available: {why}."
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
