"""What `accelerate launch` tells its workers, honoured by accel.

A script started by `accelerate launch --mixed_precision bf16 --use_deepspeed` (or under
its config file) gets its settings as `ACCELERATE_*`, `FSDP_*` and `MEGATRON_LM_*`
environment variables. `apply_accelerate_env` turns every one with an accel equivalent
into accel's own variable (an `ACCEL_*` already set wins) and warns once, naming them,
about the rest: the script never trains differently in silence. Variables about one vendor's
hardware are the adapter's to map (`Adapter.accelerate_env`): the core names no vendor.

Under `ACCELERATE_USE_MEGATRON_LM`, the `MEGATRON_LM_*` degrees and options become the options of
accel-megatron's `MegatronPlugin` (`MEGATRON_LM_TP_DEGREE` -> `tp_degree`); without it they are warned about.

`launch_defaults` is the one place the `Accelerator` reads what a launcher decided beyond
plain variables: the strategy's config (`ACCEL_STRATEGY_CONFIG`, JSON keyword arguments of
the strategy's config class) and the dynamo options (`ACCEL_DYNAMO_*`).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable, MutableMapping
from typing import Any

from ..settings.env import FP8_KEYS, EnvSettings, read_env
from ..settings.strategy_config import strategy_config_class, strategy_config_from_json
from .settings import (
    MEGATRON_RENAMES,
    SettingError,
    as_bool,
    check_config_file_fields,
    deepspeed_kwargs,
    dynamo_kwargs,
    fsdp_kwargs,
    megatron_kwargs,
)

# ACCELERATE_* -> ACCEL_*, value passed through `convert`.
_DIRECT: dict[str, tuple[str, Callable[[str], str]]] = {
    "ACCELERATE_MIXED_PRECISION": ("ACCEL_MIXED_PRECISION", str.lower),
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": ("ACCEL_GRADIENT_ACCUMULATION_STEPS", str),
    "ACCELERATE_DYNAMO_BACKEND": ("ACCEL_DYNAMO_BACKEND", str.lower),
    "ACCELERATE_DYNAMO_MODE": ("ACCEL_DYNAMO_MODE", str),
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": ("ACCEL_DYNAMO_USE_FULLGRAPH", str.lower),
    "ACCELERATE_DYNAMO_USE_DYNAMIC": ("ACCEL_DYNAMO_USE_DYNAMIC", str.lower),
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": ("ACCEL_DYNAMO_USE_REGIONAL_COMPILATION", str.lower),
}
# Boolean ACCELERATE_* that switch an ACCEL_* flag on.
_FLAGS = {
    "ACCELERATE_USE_CPU": "ACCEL_USE_CPU",
    "ACCELERATE_DEBUG_MODE": "ACCEL_DEBUG_MODE",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "ACCEL_USE_PARALLELISM_CONFIG",
}
_STRATEGIES = {
    "ACCELERATE_USE_DEEPSPEED": "deepspeed",
    "ACCELERATE_USE_FSDP": "fsdp2",
    "ACCELERATE_USE_MEGATRON_LM": "megatron",
}
_DEEPSPEED_VARS = {
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "deepspeed_config_file",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "offload_optimizer_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "offload_param_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH": "offload_optimizer_nvme_path",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH": "offload_param_nvme_path",
    "ACCELERATE_DEEPSPEED_ZERO3_INIT": "zero3_init_flag",
    "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "zero3_save_16bit_model",
    "ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping",
    "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES": "deepspeed_moe_layer_cls_names",
}
# Set by `accelerate launch` with nothing to honour: they change no numbers.
_HARMLESS = {"ACCELERATE_CONFIG_DS_FIELDS", "ACCELERATE_ENABLE_RICH", "ACCELERATE_LOG_LEVEL"}
# Set to a "no" by `accelerate launch` on every run; only a "yes" would ask for something.
_OFF_BY_DEFAULT = {"ACCELERATE_USE_SAGEMAKER", "ACCELERATE_CPU_AFFINITY"}

_warned = False


def apply_accelerate_env(env: MutableMapping[str, str] | None = None) -> list[str]:
    """Translate `accelerate launch`'s variables in `env` (default `os.environ`) into accel's.

    Returns the variables that have no accel equivalent (and warns once per process
    about them). An `ACCEL_*` variable already set is kept.

    Raises:
        SettingError: an FSDP or DeepSpeed setting accel cannot honour (FSDP1, NO_SHARD...),
            naming the variable.
    """
    global _warned
    env = os.environ if env is None else env
    names = [k for k in env if k.startswith(("ACCELERATE_", "FSDP_", "MEGATRON_LM_"))]
    if not names:
        return []
    unhonoured: list[str] = []
    for name in names:
        value = env[name]
        if name in _DIRECT:
            target, convert = _DIRECT[name]
            env.setdefault(target, convert(value))
        elif name.startswith("ACCELERATE_FP8_") and name.removeprefix("ACCELERATE_FP8_").lower() in FP8_KEYS:
            # The fp8 recipe's defaults (`--fp8_*`); the recipe is built from them in `accel.compat.handlers`.
            env.setdefault("ACCEL" + name.removeprefix("ACCELERATE"), value)
        elif name in _FLAGS:
            if as_bool(name, value):
                env.setdefault(_FLAGS[name], "1")
        elif name in _STRATEGIES:
            if as_bool(name, value):
                env.setdefault("ACCEL_STRATEGY", _STRATEGIES[name])
        elif name in _OFF_BY_DEFAULT:
            if as_bool(name, value):
                unhonoured.append(name)
        elif name.startswith("ACCELERATE_") and name not in _HARMLESS and name not in _DEEPSPEED_VARS:
            own = _adapter_variables().get(name)
            if own is None:
                unhonoured.append(name)
            else:
                env.setdefault(own, value)
    strategy = env.get("ACCEL_STRATEGY")
    megatron_vars = sorted(name for name in names if name.startswith("MEGATRON_LM_"))
    if strategy != "megatron":
        unhonoured += megatron_vars  # they configure a strategy this run does not use
    if "ACCEL_STRATEGY_CONFIG" not in env and strategy in ("fsdp2", "deepspeed"):
        config = _strategy_config_from_accelerate(env, strategy)
        if config:
            env["ACCEL_STRATEGY_CONFIG"] = json.dumps(config)
    elif "ACCEL_STRATEGY_CONFIG" not in env and strategy == "megatron" and megatron_vars:
        config, unknown = _megatron_config_from_accelerate(env, megatron_vars)
        unhonoured += unknown
        if config:
            env["ACCEL_STRATEGY_CONFIG"] = json.dumps(config)
    if unhonoured and not _warned:
        _warned = True
        _warn(
            f"accel cannot honour these `accelerate launch` settings and runs without them: "
            f"{', '.join(sorted(unhonoured))}. See docs/launching.md for each one's accel equivalent."
        )
    return sorted(unhonoured)


def _adapter_variables() -> dict[str, str]:
    """`ACCELERATE_*` variables the installed adapters honour (`Adapter.accelerate_env`) -> their own variables."""
    from ..adapter.registry import installed_adapters

    mapping: dict[str, str] = {}
    for _name, cls in sorted(installed_adapters().items()):
        mapping.update(getattr(cls, "accelerate_env", None) or {})
    return mapping


def _strategy_config_from_accelerate(env: MutableMapping[str, str], strategy: str) -> dict[str, Any]:
    """Strategy-config keyword arguments from Accelerate's FSDP_* or ACCELERATE_DEEPSPEED_* variables."""
    if strategy == "fsdp2":
        var_of = {
            "fsdp_" + var.removeprefix("FSDP_").lower().replace("transformer_cls", "transformer_layer_cls"): var
            for var in env
            if var.startswith("FSDP_")
        }
        settings: dict[str, Any] = {key: env[var] for key, var in var_of.items()}
        notes: list[str] = []  # FSDP_VERSION=1 (`--use_fsdp`'s default) runs FSDP1, as in Accelerate
        # Accelerate's plugin: no wrap policy set means NO_WRAP, and min_num_params only counts for
        # SIZE_BASED_WRAP (its launcher always writes 1e8).
        settings.setdefault("fsdp_auto_wrap_policy", "NO_WRAP")
        if str(settings["fsdp_auto_wrap_policy"]).upper() != "SIZE_BASED_WRAP":
            settings.pop("fsdp_min_num_params", None)
        translate = fsdp_kwargs
    else:
        var_of = {key: var for var, key in _DEEPSPEED_VARS.items() if var in env}
        settings, notes, translate = {key: env[var] for key, var in var_of.items()}, [], deepspeed_kwargs
        if env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none") not in ("", "none"):
            # `accelerate launch` lists its config file's `deepspeed_config` keys here (Accelerate's check).
            try:
                check_config_file_fields(env.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(","))
            except SettingError as exc:
                raise SettingError("ACCELERATE_CONFIG_DS_FIELDS", str(exc).split(": ", 1)[1]) from None
    try:
        kwargs, more = translate(settings)
    except SettingError as exc:
        raise SettingError(var_of[exc.key], str(exc).split(": ", 1)[1]) from None
    for note in notes + more:
        key = note.split(" ", 1)[0]
        _warn(f"{var_of[key]}{note[len(key) :]}" if key in var_of else note)
    return kwargs


def _megatron_config_from_accelerate(
    env: MutableMapping[str, str], names: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """`MegatronPlugin` keyword arguments from `accelerate launch`'s `MEGATRON_LM_<OPTION>` variables
    (`--megatron_lm_tp_degree 2` arrives as `MEGATRON_LM_TP_DEGREE=2`), and the variables accel-megatron
    has no option for (warned about, like any setting accel cannot honour).

    Raises:
        SettingError: accel-megatron is not installed, or a value its option cannot take, naming the variable.
    """
    import dataclasses

    try:
        cls = strategy_config_class("megatron")
    except SettingError as exc:
        raise SettingError("ACCELERATE_USE_MEGATRON_LM", str(exc).split(": ", 1)[1]) from None
    fields = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
    settings: dict[str, str] = {}
    unknown: list[str] = []
    var_of: dict[str, str] = {}
    for var in names:
        key = "megatron_lm_" + var.removeprefix("MEGATRON_LM_").lower()
        option = MEGATRON_RENAMES.get(key.removeprefix("megatron_lm_"), key.removeprefix("megatron_lm_"))
        if option not in fields:
            unknown.append(var)
        elif env[var] not in ("", "None"):  # Accelerate writes str(None) for an unset option
            settings[key], var_of[key] = env[var], var
    try:
        return megatron_kwargs(settings), unknown
    except SettingError as exc:
        raise SettingError(var_of.get(exc.key, exc.key), str(exc).split(": ", 1)[1]) from None


def _warn(message: str) -> None:
    """A warning from the first process of each node only (every rank reads the same variables),
    attributed to the user's line that built the Accelerator."""
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel/
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level)


def launch_defaults(
    strategy: str | None,
    strategy_config: Any,
    plugin_given: bool,
    dynamo_backend: str | None,
    dynamo_plugin: Any,
    *,
    env: EnvSettings | None = None,
) -> tuple[str | None, Any, Any]:
    """The Accelerator's strategy, strategy config and dynamo plugin, with the launcher's
    settings (`env`, default: this process's, with `accelerate launch`'s variables applied) filling
    what the script left unset.

    Returns `(strategy, strategy_config, dynamo_plugin)`; each is the argument given when
    the script set it.
    """
    if env is None:
        apply_accelerate_env()
        env = read_env()
    env_strategy = env.strategy
    if strategy is None and env_strategy is None and not plugin_given and env.use_parallelism_config:
        # A launcher's ParallelismConfig (`--use_parallelism_config`) composes on the FSDP2 strategy.
        strategy = "fsdp2"
    raw = env.strategy_config
    if raw and strategy_config is None and not plugin_given and (strategy or env_strategy) == env_strategy:
        strategy_config = strategy_config_from_json(env_strategy, raw)
    if dynamo_plugin is None and dynamo_backend is None:
        settings = dict(env.dynamo)
        if settings:
            from ..settings.kwargs import TorchDynamoPlugin

            dynamo_plugin = TorchDynamoPlugin(**dynamo_kwargs(settings))
    return strategy, strategy_config, dynamo_plugin
