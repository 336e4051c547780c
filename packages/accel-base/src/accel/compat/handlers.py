"""Accelerate's remaining kwargs handlers and enums: profiling, fp8 recipes, tracker and precision names.

Pass the handlers in `Accelerator(kwargs_handlers=[...])`: `ProfileKwargs` configures
`Accelerator.profile`; the fp8 recipe handlers (`FP8RecipeKwargs`, `TERecipeKwargs`,
`AORecipeKwargs`) are kept on the Accelerator (`fp8_recipe_handler`, ...) for the adapters
that implement fp8 to read.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..distributed.rng import RNGType
from ..settings.kwargs import KwargsHandler


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
    """fp8 recipe for Transformer-Engine-style delayed scaling (read by the adapters that run fp8 with it)."""

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if self.fp8_format is not None:
            self.fp8_format = self.fp8_format.upper()
            if self.fp8_format not in ("E4M3", "HYBRID"):
                raise ValueError(f"fp8_format must be 'E4M3' or 'HYBRID', got {self.fp8_format!r}.")
        if self.amax_compute_algo is not None and self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}.")


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 recipe for torchao's float8 training: its `Float8LinearConfig` and which modules to convert."""

    config: Any = None
    module_filter_func: Callable[..., bool] | None = None
    pad_inner_dim: bool | None = None
    """With `config=None`: build a `Float8LinearConfig(pad_inner_dim=...)` (as Accelerate does)."""
    enable_fsdp_float8_all_gather: bool | None = None
    """With `config=None`: build a `Float8LinearConfig(enable_fsdp_float8_all_gather=...)`."""

    def __post_init__(self) -> None:
        flags = {
            name: getattr(self, name)
            for name in ("pad_inner_dim", "enable_fsdp_float8_all_gather")
            if getattr(self, name) is not None
        }
        if not flags:
            return
        if self.config is not None:
            raise ValueError(
                f"AORecipeKwargs: {', '.join(flags)} only apply when no `config` is given (Accelerate ignores them "
                "then); set them on the Float8LinearConfig you pass instead."
            )
        try:
            from torchao.float8 import Float8LinearConfig
        except ImportError as e:
            raise ImportError(
                f"AORecipeKwargs({', '.join(f'{k}=' for k in flags)}) builds a torchao `Float8LinearConfig`, and "
                "torchao is not installed: install torchao (with an adapter that supports fp8), or drop these "
                "arguments."
            ) from e
        self.config = Float8LinearConfig(**flags)


@dataclass
class FP8RecipeKwargs(TERecipeKwargs):
    """Accelerate's combined fp8 handler: a `TERecipeKwargs` plus the `backend` it is for ("te", "ao")."""

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
