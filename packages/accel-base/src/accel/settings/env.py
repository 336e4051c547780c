"""The environment variables accel reads, parsed in one place into typed settings.

`read_env()` is called when a state, an `Accelerator`, a logger or a config object is built,
never at import: tests and launchers set variables between importing accel and building one.
The launcher's rank variables are parsed by `accel.settings.launch` (called from here).
Accelerate's `ACCELERATE_*` variables are translated into these by `accel.compat.env` before a state
is built; the few Accelerate names read here directly are those accel always read as fallbacks
(`ACCELERATE_LOG_LEVEL`, `ACCELERATE_USE_PARALLELISM_CONFIG`, `PARALLELISM_CONFIG_*`), and
`ACCELERATE_GRADIENT_ACCUMULATION_STEPS` only to name the variable the user set in an error.

Two values are checked only where they are used, so that an explicit argument keeps a bad
variable harmless, as it always has: `timeout` (an `InitProcessGroupKwargs(timeout=)` wins) and
`gradient_accumulation_steps` (read by the `Accelerator` only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType

from ..errors import SettingError
from .launch import LaunchInfo, parse_launch

_TRUE = ("1", "true", "yes", "on")
DETACHED_OPTIMIZERS_VARIABLE = "ACCEL_ALLOW_DETACHED_OPTIMIZERS"
"""Set to 1, `prepare` accepts an optimizer that holds no parameter of any prepared model (else an error)."""
DEFAULT_COLLECTIVE_WARN_SECONDS = 60.0
"""After how long a collective that waits is reported on every rank, unless `ACCEL_COLLECTIVE_WARN_SECONDS` says."""
DYNAMO_KEYS = ("dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")
"""The `TorchDynamoPlugin` settings a launcher passes as `ACCEL_<KEY>` (`ACCEL_DYNAMO_MODE`, ...)."""
PARALLELISM_KEYS = (
    "dp_replicate_size",
    "dp_shard_size",
    "tp_size",
    "cp_size",
    "sp_size",
    "cp_comm_strategy",
    "cp_backend",
    "sp_backend",
)
"""The `ParallelismConfig` fields a launcher may default (`ACCEL_PARALLELISM_TP_SIZE`, ...)."""
FP8_KEYS = (
    "backend",
    "format",
    "margin",
    "interval",
    "amax_history_len",
    "amax_compute_algo",
    "override_fprop",
    "override_dgrad",
    "override_wgrad",
    "use_mxfp8_block_scaling",
    "use_autocast_during_eval",
    "pad_inner_dim",
    "enable_fsdp_float8_all_gather",
    "opt_level",
)
"""The fp8 recipe defaults a launcher may pass as `ACCEL_FP8_<KEY>` (`accelerate launch --fp8_*` sets
`ACCELERATE_FP8_<KEY>`, translated by `accel.compat.env`)."""
BROKEN_ADAPTERS_VARIABLE = "ACCEL_BROKEN_ADAPTERS_REPORTED"
"""Set by a process that reported broken adapter plugins (`<pid>:<name>,<name>`) for the workers it starts."""
LOG_LEVEL_VARIABLES = ("ACCEL_LOG_LEVEL", "ACCELERATE_LOG_LEVEL")
"""Where `get_logger` finds its default level, first set wins (Accelerate's name too, as its loggers read it)."""
ACCUMULATION_VARIABLE = "ACCEL_GRADIENT_ACCUMULATION_STEPS"
# `accelerate launch` sets this one and accel maps it onto ACCUMULATION_VARIABLE: errors name the one the user set.
_ACCELERATE_ACCUMULATION_VARIABLE = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in _TRUE


def _text(env: Mapping[str, str], name: str) -> str | None:
    return env.get(name) or None


@dataclass(kw_only=True, frozen=True)
class EnvSettings:
    """What the environment asks of this process (`ACCEL_*`, the launcher's ranks)."""

    adapter: str | None = None
    """`ACCEL_ADAPTER`: the adapter to use; None lets the registry pick the best available one."""
    use_cpu: bool = False
    """`ACCEL_USE_CPU`: force the built-in cpu adapter, whatever hardware is installed."""
    emulate: bool = False
    """`ACCEL_EMULATE`: run the adapter's own code paths on the CPU with gloo (no device needed)."""
    mixed_precision: str | None = None
    """`ACCEL_MIXED_PRECISION`: "no", "bf16", "fp16" or "fp8" when the script does not say; None: "no"."""
    strategy: str | None = None
    """`ACCEL_STRATEGY`: the strategy when the script names none; None: the adapter's default."""
    strategy_config: str | None = None
    """`ACCEL_STRATEGY_CONFIG`: JSON keyword arguments of the strategy's config class, as a launcher wrote them."""
    timeout_text: str | None = None
    """`ACCEL_TIMEOUT` as set (seconds); read through `timeout`, which checks it."""
    collective_warn_text: str | None = None
    """`ACCEL_COLLECTIVE_WARN_SECONDS` as set; read through `collective_warn_seconds`, which checks it."""
    debug: bool = False
    """`ACCEL_DEBUG_MODE`: check every collective across ranks first; costs one small collective each."""
    allow_detached_optimizers: bool = False
    """`ACCEL_ALLOW_DETACHED_OPTIMIZERS`: `prepare` accepts an optimizer holding no prepared model's parameters
    (tensors trained outside every model); without it that optimizer is refused as a mistake."""
    fork_launched: bool = False
    """`FORK_LAUNCHED`: set by `notebook_launcher`'s forked workers, whose launcher owns the process group."""
    gradient_accumulation_text: str = ""
    """`ACCEL_GRADIENT_ACCUMULATION_STEPS` as set; read through `gradient_accumulation_steps`, which checks it."""
    gradient_accumulation_variable: str = ACCUMULATION_VARIABLE
    """The variable the user set for it (Accelerate's name when `accelerate launch` set it), for messages."""
    dynamo_backend: str | None = None
    """`ACCEL_DYNAMO_BACKEND`, lower-cased: the compile backend when `TorchDynamoPlugin(backend=)` is unset."""
    dynamo: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The other dynamo settings a launcher passed (`dynamo_mode` -> `ACCEL_DYNAMO_MODE`'s value, ...)."""
    use_parallelism_config: bool = False
    """`ACCEL_USE_PARALLELISM_CONFIG`: the launcher asked for a `ParallelismConfig` (`--use_parallelism_config`)."""
    parallelism: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    fp8: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The fp8 recipe defaults a launcher passed, by `FP8_KEYS` key (`backend` -> `ACCEL_FP8_BACKEND`'s value);
    parsed where the recipe is built (`accel.compat.handlers`), so a handler given in code keeps a bad one harmless."""
    """`ParallelismConfig` defaults by field (`tp_size` -> `ACCEL_PARALLELISM_TP_SIZE`, else Accelerate's
    `PARALLELISM_CONFIG_TP_SIZE`)."""
    config_file: str | None = None
    """`ACCEL_CONFIG_FILE`: the config file `accel config` writes and `accel launch` reads."""
    cache_home: str | None = None
    """`XDG_CACHE_HOME`: where the default config file lives (`<it>/accel/default_config.yaml`; else ~/.cache)."""
    log_level: str | None = None
    """The default level of `get_logger` loggers (`LOG_LEVEL_VARIABLES`, first set wins)."""
    broken_adapters_reported: str = ""
    """`ACCEL_BROKEN_ADAPTERS_REPORTED`: which broken adapter plugins the launcher (`<pid>:`) already reported."""
    launched_worker: bool = False
    """`LOCAL_RANK` is set: a launcher started this process."""
    launch: LaunchInfo = field(default_factory=LaunchInfo)
    """Where this process stands in the job, as its launcher described it."""
    variables: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """The environment as read, for the adapter's own options (an adapter declares their variables)."""

    @property
    def timeout(self) -> timedelta | None:
        """`ACCEL_TIMEOUT` as a duration; None when unset (the caller's default applies).

        Raises:
            ValueError: the variable is not a positive number of seconds.
        """
        value = self.timeout_text
        if not value:
            return None
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(
                f"ACCEL_TIMEOUT={value!r} is not a positive number of seconds. Set it to how long a collective "
                "may wait for the other processes (for example ACCEL_TIMEOUT=600), or unset it for 30 minutes."
            )
        return timedelta(seconds=seconds)

    @property
    def collective_warn_seconds(self) -> float:
        """`ACCEL_COLLECTIVE_WARN_SECONDS`: after how long a waiting collective is reported (`accel.distributed.watchdog`);
        60 when unset, 0 turns the watchdog off.

        Raises:
            SettingError: the variable is not a number of seconds >= 0.
        """
        text = (self.collective_warn_text or "").strip()
        if not text:
            return DEFAULT_COLLECTIVE_WARN_SECONDS
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or seconds == float("inf"):
            raise SettingError(
                "ACCEL_COLLECTIVE_WARN_SECONDS",
                f"expected a number of seconds >= 0 (0 turns the stuck-collective warning off), got {text!r}",
            )
        return seconds

    @property
    def gradient_accumulation_steps(self) -> int | None:
        """`ACCEL_GRADIENT_ACCUMULATION_STEPS` as an int; None when unset or blank.

        Raises:
            ValueError: the variable is not an int >= 1 (the message names the variable the user set).
        """
        text = self.gradient_accumulation_text
        if not text.strip():
            return None
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            name = self.gradient_accumulation_variable
            raise ValueError(
                f"{name}={text!r} is not an int >= 1. Set it to the number of micro-batches "
                f"per optimizer step (for example {name}=4), or unset it."
            )
        return value


def read_env(environ: Mapping[str, str] | None = None) -> EnvSettings:
    """Parse `environ` (default: `os.environ`, now) into `EnvSettings`.

    Raises:
        ValueError: a launcher variable that is not a number (`WORLD_SIZE=two`).
    """
    env = dict(os.environ if environ is None else environ)
    accumulation = env.get(ACCUMULATION_VARIABLE, "")
    dynamo_backend = env.get("ACCEL_DYNAMO_BACKEND")
    parallelism_flag = env.get("ACCEL_USE_PARALLELISM_CONFIG", env.get("ACCELERATE_USE_PARALLELISM_CONFIG", ""))
    parallelism = {
        key: value
        for key in PARALLELISM_KEYS
        if (value := env.get(f"ACCEL_PARALLELISM_{key.upper()}", env.get(f"PARALLELISM_CONFIG_{key.upper()}")))
        is not None
    }
    return EnvSettings(
        adapter=_text(env, "ACCEL_ADAPTER"),
        use_cpu=_flag(env, "ACCEL_USE_CPU"),
        emulate=_flag(env, "ACCEL_EMULATE"),
        mixed_precision=_text(env, "ACCEL_MIXED_PRECISION"),
        strategy=env.get("ACCEL_STRATEGY"),
        strategy_config=_text(env, "ACCEL_STRATEGY_CONFIG"),
        timeout_text=env.get("ACCEL_TIMEOUT"),
        collective_warn_text=env.get("ACCEL_COLLECTIVE_WARN_SECONDS"),
        debug=_flag(env, "ACCEL_DEBUG_MODE"),
        allow_detached_optimizers=_flag(env, DETACHED_OPTIMIZERS_VARIABLE),
        fork_launched=_flag(env, "FORK_LAUNCHED"),
        gradient_accumulation_text=accumulation,
        gradient_accumulation_variable=(
            _ACCELERATE_ACCUMULATION_VARIABLE
            if env.get(_ACCELERATE_ACCUMULATION_VARIABLE) == accumulation
            else ACCUMULATION_VARIABLE
        ),
        dynamo_backend=dynamo_backend.lower() if dynamo_backend else None,
        dynamo=MappingProxyType({key: env[var] for key in DYNAMO_KEYS if (var := "ACCEL_" + key.upper()) in env}),
        use_parallelism_config=parallelism_flag.strip().lower() in ("1", "true", "yes"),
        parallelism=MappingProxyType(parallelism),
        fp8=MappingProxyType({key: env[var] for key in FP8_KEYS if (var := "ACCEL_FP8_" + key.upper()) in env}),
        config_file=_text(env, "ACCEL_CONFIG_FILE"),
        cache_home=_text(env, "XDG_CACHE_HOME"),
        log_level=next((env[v] for v in LOG_LEVEL_VARIABLES if env.get(v)), None),
        broken_adapters_reported=env.get(BROKEN_ADAPTERS_VARIABLE, ""),
        launched_worker="LOCAL_RANK" in env,
        launch=parse_launch(env),
        variables=MappingProxyType(env),
    )
