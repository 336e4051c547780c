"""Accelerate's remaining kwargs handlers and enums: profiling, fp8 recipes, tracker and precision names.

Pass the handlers in `Accelerator(kwargs_handlers=[...])`: `ProfileKwargs` configures
`Accelerator.profile`; the fp8 recipe handlers (`FP8RecipeKwargs`, `TERecipeKwargs`,
`AORecipeKwargs`) are kept on the Accelerator (`fp8_recipe_handler`, ...) and folded, with the
launcher's fp8 settings, into the run's `accel.precision.fp8_request.FP8Request` (`accel.compat.fp8`),
which the adapter's precision applies or refuses field by field.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..distributed.rng import RNGType
from ..settings.kwargs import KwargsHandler

FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")


class LoggerType(str, enum.Enum):
    """Tracker names accepted by `Accelerator(log_with=...)`."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class PrecisionType(str, enum.Enum):
    """Values of `mixed_precision`."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class DynamoBackend(str, enum.Enum):
    """`torch.compile` backends accepted by `TorchDynamoPlugin(backend=...)` (hardware-specific ones come
    from the adapters; any backend torch knows is accepted by name)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    TVM = "TVM"


@dataclass
class ProfileKwargs(KwargsHandler):
    """`torch.profiler` settings for `Accelerator.profile()`.

    `activities`: names such as "cpu" (and the device's, e.g. the adapter's device type);
    `schedule_option`: keyword arguments of `torch.profiler.schedule` (wait, warmup, active,
    repeat, skip_first); `output_trace_dir`: where each process writes its Chrome trace
    (`profile_<r>.json`, as in Accelerate) when the block ends (or when the schedule says so).
    """

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None

    def _activity(self, name: Any) -> torch.profiler.ProfilerActivity:
        if isinstance(name, torch.profiler.ProfilerActivity):
            return name
        activity = getattr(torch.profiler.ProfilerActivity, str(name).upper(), None)
        if activity is None:
            known = [a.name.lower() for a in torch.profiler.ProfilerActivity.__members__.values()]
            raise ValueError(f"Unknown profiler activity {name!r}; torch knows {known}.")
        return activity

    def build(self) -> torch.profiler.profile:
        """The `torch.profiler.profile` these settings describe."""
        activities = [self._activity(a) for a in self.activities] if self.activities is not None else None
        schedule = torch.profiler.schedule(**self.schedule_option) if self.schedule_option is not None else None
        return torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self.on_trace_ready,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )


@dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 with delayed scaling (Transformer-Engine style); passing it selects the "te" backend.

    A field left None takes the launcher's `ACCEL_FP8_*` value (`accelerate launch --fp8_*`), else the
    backend's default (Accelerate's: HYBRID, margin 0, interval 1, history 1024, "most_recent"). The adapter's
    precision applies every field given, or refuses it by name where its hardware cannot
    (`accel.errors.FP8RecipeError`).
    """

    use_autocast_during_eval: bool | None = None
    """Also compute in fp8 when the model is in eval mode."""
    margin: int | None = None
    """Headroom below the format's maximum, in powers of two."""
    interval: int | None = None
    """Recompute the scales every this many steps."""
    fp8_format: str | None = None
    """"HYBRID" (E4M3 forward, E5M2 gradients), "E4M3" or "E5M2"."""
    amax_history_len: int | None = None
    """Steps of amax remembered."""
    amax_compute_algo: str | None = None
    """"most_recent" or "max" (over the history)."""
    override_linear_precision: tuple[bool, bool, bool] | None = None
    """Run the (forward, data-gradient, weight-gradient) GEMMs in higher precision."""
    use_mxfp8_block_scaling: bool | None = None
    """MXFP8 block scaling instead of delayed per-tensor scaling (where the hardware has it)."""

    def __post_init__(self) -> None:
        if self.fp8_format is not None:
            self.fp8_format = self.fp8_format.upper()
            if self.fp8_format not in FP8_FORMATS:
                raise ValueError(f"`fp8_format` must be one of {' or '.join(FP8_FORMATS)}, got {self.fp8_format!r}.")
        if self.amax_compute_algo is not None:
            self.amax_compute_algo = self.amax_compute_algo.lower()
            if self.amax_compute_algo not in AMAX_COMPUTE_ALGOS:
                raise ValueError(
                    f"`amax_compute_algo` must be one of {' or '.join(AMAX_COMPUTE_ALGOS)}, "
                    f"got {self.amax_compute_algo!r}."
                )
        if self.override_linear_precision is not None:
            flags = tuple(bool(v) for v in self.override_linear_precision)
            if len(flags) != 3:
                raise ValueError(
                    "`override_linear_precision` takes three booleans (fprop, dgrad, wgrad), "
                    f"got {self.override_linear_precision!r}."
                )
            self.override_linear_precision = (flags[0], flags[1], flags[2])


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 through torchao's float8 training; passing it selects the "ao" backend.

    With `config=None` the adapter builds torchao's `Float8LinearConfig` from `pad_inner_dim` and
    `enable_fsdp_float8_all_gather` (each None: the launcher's `ACCEL_FP8_*` value, else True, as in
    Accelerate).
    """

    config: Any = None
    """A `torchao.float8.Float8LinearConfig`, used as it is."""
    module_filter_func: Callable[..., bool] | None = None
    """`(module, fqn) -> bool`: which Linears to convert; None: every Linear with both dimensions multiples of 16
    except the model's first and last (Accelerate's `filter_linear_layers`)."""
    pad_inner_dim: bool | None = None
    """With `config=None`: pad GEMM inner dimensions to multiples of 16."""
    enable_fsdp_float8_all_gather: bool | None = None
    """With `config=None`: under FSDP2, all-gather weights in fp8 (and precompute their scales after each
    optimizer step)."""

    def __post_init__(self) -> None:
        flags = [name for name in ("pad_inner_dim", "enable_fsdp_float8_all_gather") if getattr(self, name) is not None]
        if flags and self.config is not None:
            raise ValueError(
                f"AORecipeKwargs: {', '.join(flags)} only apply when no `config` is given (Accelerate ignores them "
                "then); set them on the Float8LinearConfig you pass instead."
            )


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Accelerate's older combined fp8 handler: a `TERecipeKwargs` plus the `backend` it is for.

    `backend`: "TE" (the default), or "AO" (torchao, with its defaults; accel's addition: Accelerate accepts
    "TE" or "MSAMP"). None: the launcher's `ACCEL_FP8_BACKEND`, else "TE". MS-AMP is refused.
    """

    backend: str | None = None
    opt_level: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend is not None:
            self.backend = self.backend.upper()
            if self.backend == "MSAMP" or self.opt_level is not None:
                raise NotImplementedError(
                    "FP8RecipeKwargs(backend='msamp') / opt_level: MS-AMP is not supported by accel. "
                    "Use TERecipeKwargs or AORecipeKwargs with an adapter that supports fp8."
                )
            if self.backend not in ("TE", "AO"):
                raise ValueError(f"FP8RecipeKwargs: `backend` must be 'TE' or 'AO', got {self.backend!r}.")


__all__ = [
    "AORecipeKwargs",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "RNGType",
    "TERecipeKwargs",
]
