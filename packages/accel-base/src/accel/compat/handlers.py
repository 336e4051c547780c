"""Accelerate's remaining kwargs handlers and enums: profiling, fp8 recipes, tracker and precision names.

Pass the handlers in `Accelerator(kwargs_handlers=[...])`: `ProfileKwargs` configures
`Accelerator.profile`; the fp8 recipe handlers (`FP8RecipeKwargs`, `TERecipeKwargs`,
`AORecipeKwargs`) are kept on the Accelerator (`fp8_recipe_handler`, ...) and folded, with the
launcher's fp8 settings, into the run's `accel.precision.fp8_request.FP8Request` (`accel.compat.handlers`),
which the adapter's precision applies or refuses field by field.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from ..distributed.rng import RNGType
from ..errors import SettingError
from ..precision.fp8_request import AO_FIELDS, FP8_BACKENDS, MSAMP_FIELDS, TE_FIELDS, FP8Request
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

    `activities`: names such as "cpu" (and the device's, e.g. the adapter's device type); without them the
    CPU and the adapter's device are profiled, as torch's default does on that hardware;
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

    def build(self, device_type: str | None = None) -> torch.profiler.profile:
        """The `torch.profiler.profile` these settings describe. Without `activities`: the CPU and the activity
        named after `device_type` (the adapter's hardware, as torch's default profiles the GPU next to the CPU)
        when torch has one, else torch's default."""
        activities: list[torch.profiler.ProfilerActivity] | None
        if self.activities is not None:
            activities = [self._activity(a) for a in self.activities]
        else:
            device = getattr(torch.profiler.ProfilerActivity, str(device_type).upper(), None)
            cpu = torch.profiler.ProfilerActivity.CPU
            activities = [cpu, device] if device is not None and device != cpu else None
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


# ---- the run's fp8 request ---------------------------------------------------------------------
# Precedence as in Accelerate: the handler given in code chooses the backend (`TERecipeKwargs` -> "te",
# `AORecipeKwargs` -> "ao", `FP8RecipeKwargs(backend=...)`), then `ACCEL_FP8_BACKEND` (which
# `ACCELERATE_FP8_BACKEND`, `--fp8_backend` and a config file's `fp8_config.backend` become), else the adapter
# picks. A field the handler leaves None takes the launcher's `ACCEL_FP8_<FIELD>`, as Accelerate's handlers
# read `ACCELERATE_FP8_<FIELD>`.

_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")


def _flag(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected true or false, got {text!r}.")
    return value in _TRUE


def _whole(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected a whole number, got {text!r}.") from None


def _choice(choices: tuple[str, ...], upper: bool) -> Callable[[str, str], str]:
    def parse(key: str, text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in choices:
            raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected one of {', '.join(choices)}, got {text!r}.")
        return value

    return parse


# ACCEL_FP8_<KEY> -> (recipe field, parser). The three override flags make one field, below.
_ENV_FIELDS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "format": ("fp8_format", _choice(FP8_FORMATS, upper=True)),
    "margin": ("margin", _whole),
    "interval": ("interval", _whole),
    "amax_history_len": ("amax_history_len", _whole),
    "amax_compute_algo": ("amax_compute_algo", _choice(AMAX_COMPUTE_ALGOS, upper=False)),
    "use_mxfp8_block_scaling": ("use_mxfp8_block_scaling", _flag),
    "use_autocast_during_eval": ("use_autocast_during_eval", _flag),
    "pad_inner_dim": ("pad_inner_dim", _flag),
    "enable_fsdp_float8_all_gather": ("enable_fsdp_float8_all_gather", _flag),
    "opt_level": ("opt_level", _choice(("O1", "O2"), upper=True)),
}
_OVERRIDES = ("override_fprop", "override_dgrad", "override_wgrad")


def _launcher_fields(env_fp8: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """The recipe fields the launcher set: field -> (value, the variable's name)."""
    fields: dict[str, tuple[Any, str]] = {}
    for key, (name, parse) in _ENV_FIELDS.items():
        if key in env_fp8:
            fields[name] = (parse(key, env_fp8[key]), f"ACCEL_FP8_{key.upper()}")
    if any(k in env_fp8 for k in _OVERRIDES):
        value = tuple(_flag(k, env_fp8[k]) if k in env_fp8 else False for k in _OVERRIDES)
        fields["override_linear_precision"] = (value, "ACCEL_FP8_OVERRIDE_{FPROP,DGRAD,WGRAD}")
    return fields


def fp8_request(handlers: Mapping[type, Any], env_fp8: Mapping[str, str]) -> FP8Request:
    """The run's `FP8Request` from the kwargs handlers (by class) and the launcher's `ACCEL_FP8_*` values.

    Raises:
        ValueError: two fp8 recipe handlers (each chooses a backend), or `FP8RecipeKwargs(backend='AO')` with
            fields of the "te" family.
        SettingError: an `ACCEL_FP8_*` value that does not parse (only when no handler field replaces it).
    """
    given = [h for kind, h in handlers.items() if issubclass(kind, (TERecipeKwargs, AORecipeKwargs))]
    if len(given) > 1:
        names = " and ".join(type(h).__name__ for h in given)
        raise ValueError(f"Pass one fp8 recipe handler, got {names}: each chooses the fp8 backend. Keep one.")
    handler = given[0] if given else None
    backend, backend_source = None, ""
    if isinstance(handler, FP8RecipeKwargs):
        if handler.backend is not None:
            backend, backend_source = handler.backend.lower(), "FP8RecipeKwargs(backend=)"
    elif isinstance(handler, TERecipeKwargs):
        backend, backend_source = "te", "TERecipeKwargs"
    elif isinstance(handler, AORecipeKwargs):
        backend, backend_source = "ao", "AORecipeKwargs"
    if backend is None and "backend" in env_fp8:
        backend = _choice(FP8_BACKENDS, upper=False)("backend", env_fp8["backend"])
        backend_source = "ACCEL_FP8_BACKEND"
    if backend is None and isinstance(handler, FP8RecipeKwargs):
        backend, backend_source = "te", "FP8RecipeKwargs (backend defaults to 'TE')"

    launcher = {name: pair for name, pair in _launcher_fields(env_fp8).items() if name not in _code_fields(handler)}
    settings: dict[str, Any] = {name: value for name, (value, _) in launcher.items()}
    sources = {name: source for name, (_, source) in launcher.items()}
    code = _code_fields(handler)
    settings.update(code)
    sources.update({name: f"{type(handler).__name__}({name}=)" for name in code})
    if backend is not None:
        family = {"te": TE_FIELDS, "ao": AO_FIELDS, "msamp": MSAMP_FIELDS}[backend]
        stray = [name for name in code if name not in family]
        if stray:
            raise ValueError(
                f"{type(handler).__name__}(backend={backend.upper()!r}) with {', '.join(stray)}: these fields "
                f"configure the 'te' backend. Drop them, or use TERecipeKwargs."
            )
        # Launcher defaults of another family configure a backend this run does not use (Accelerate reads them
        # only in that family's handler).
        settings = {k: v for k, v in settings.items() if k in family}
        sources = {k: v for k, v in sources.items() if k in family}
    return FP8Request(
        backend=backend,
        backend_source=backend_source,
        settings=MappingProxyType(settings),
        sources=MappingProxyType(sources),
    )


def check_fp8_handlers_used(handlers: Mapping[type, Any], requested: str | None, fp8: bool, strategy: str) -> None:
    """An fp8 recipe handler is refused when nothing in the run is fp8, as Accelerate does (except under FSDP2 and
    DeepSpeed, which Accelerate exempts): `requested` is the precision asked for, `fp8` whether the run's
    precision converts models to fp8 anyway (an adapter's own fp8 option).

    Raises:
        ValueError: Accelerate's message.
    """
    given = any(issubclass(kind, (TERecipeKwargs, AORecipeKwargs)) for kind in handlers)
    if given and not fp8 and str(requested or "no").lower() != "fp8" and strategy not in ("fsdp2", "deepspeed"):
        raise ValueError("Passing in an FP8 configuration requires setting `mixed_precision='fp8'`.")


def _code_fields(handler: Any) -> dict[str, Any]:
    """The recipe fields a handler sets (None: left to the launcher or the backend)."""
    if handler is None:
        return {}
    names = AO_FIELDS if isinstance(handler, AORecipeKwargs) else TE_FIELDS
    return {name: value for name in names if (value := getattr(handler, name, None)) is not None}


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
