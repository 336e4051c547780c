"""Config files written by `accelerate config`, read as they are by `accel launch --config_file`.

Each key maps onto an `accel launch` setting, or is refused with a `ConfigError` naming the
key, its line and what to do. Keys accel has no use for are accepted silently while they
hold Accelerate's default value (false, "no", empty): such a key asks for nothing.

A file for one vendor's hardware (a `distributed_type` such as MULTI_GPU that is the `data_parallel_name`
of an adapter) may carry Accelerate's keys for that hardware. The core names no vendor, so the
adapter declares them (`accelerate_config_keys`, see `hardware_keys`): a key it calls harmless is
ignored with one warning naming every such key, a key with a reason is refused with that reason.
With no adapter for that hardware installed, its keys are ignored with the same warning (the run
needs `--cpu` then, and they mean nothing on the CPU). A key an adapter reads under any
`distributed_type` (a CPU extension's section, say) is the adapter's to translate
(`Adapter.accelerate_config_settings`); a section whose keys all hold their defaults asks for nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..settings.config_file import PRECISIONS, ConfigError
from ..settings.launch import check_host
from .settings import SettingError, as_bool, deepspeed_file_kwargs, dynamo_kwargs, fsdp_kwargs, megatron_kwargs

STRATEGY_TYPES = {"FSDP": "fsdp2", "DEEPSPEED": "deepspeed", "MEGATRON_LM": "megatron"}


def _is_off(value: Any) -> bool:
    """Accelerate's default for keys accel does not use: nothing asked for."""
    if isinstance(value, dict):  # a section whose every key is at its default asks for nothing either
        return all(_is_off(v) for v in value.values())
    if isinstance(value, list):
        return not value
    return value is None or value is False or value in ("", "no", "NO", "none", "main", "all")


def accelerate_launch_defaults(data: dict[str, Any], lines: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """`accel launch` destinations and values for an Accelerate config, and notes to print.

    Raises:
        ConfigError: a key accel cannot honour, naming its line.
    """
    out: dict[str, Any] = {}
    notes: list[str] = []

    def fail(key: str, message: str) -> ConfigError:
        return ConfigError(f"{lines.get(key, 'config')}: {key}: {message}")

    dtype = str(data.get("distributed_type", "NO")).upper()
    hardware = dtype not in ("NO", "MULTI_CPU", *STRATEGY_TYPES)
    claimed, adapters = hardware_keys(dtype) if hardware else ({}, [])
    ignored: list[str] = []
    read_by_adapters = _AdapterKeys()
    for key, value in data.items():
        handler = _HANDLERS.get(key)
        try:
            if handler is not None:
                handler(key, value, data, out, notes)
            elif (settings := read_by_adapters(key, value)) is not None:
                out.update(settings)
            elif _is_off(value):
                continue
            elif claimed.get(key):
                raise SettingError(key, str(claimed[key]))
            elif key in claimed or (hardware and not adapters):
                ignored.append(key)
            else:
                why = f" (nor does the {', '.join(adapters)} adapter read it)" if adapters else ""
                raise SettingError(key, f"accel has no equivalent{why}; remove the key (or set it to its default)")
        except SettingError as exc:
            inner = f"{key}.{exc.key}"  # a key inside fsdp_config, deepspeed_config, ...
            raise fail(inner if inner in lines else key, str(exc).split(": ", 1)[1]) from None
    machines = int(out.get("nnodes", 1))  # checked by its handler
    if ignored:  # one note naming them all: printed once per launch
        whose = (
            f"the {', '.join(adapters)} adapter calls them harmless"
            if adapters
            else f"no adapter for distributed_type {dtype} is installed"
        )
        notes.append(
            f"{', '.join(ignored)}: ignored ({whose}); they configure Accelerate's own launcher for that hardware, "
            "and `accel launch` runs on this host (run it on each host of a multi-host job, docs/launching.md)"
        )
    if dtype in STRATEGY_TYPES:
        out["strategy"] = STRATEGY_TYPES[dtype]
    elif dtype == "MULTI_CPU":
        out["cpu"] = True
    elif dtype != "NO":
        # A hardware type (one vendor's devices): accel picks the adapter for what is installed.
        out["required_hardware"] = dtype
    processes = data.get("num_processes")
    if processes == -1 and not isinstance(processes, bool):
        processes = None  # Accelerate's ClusterConfig default: "not given" (then one per device, as in Accelerate)
    if processes is not None:
        try:
            processes = _count("num_processes", processes)
        except SettingError as exc:
            raise fail("num_processes", str(exc).split(": ", 1)[1]) from None
        if machines > 1:
            if processes % machines:
                raise fail("num_processes", f"{processes} processes do not split evenly over {machines} machines")
            processes //= machines  # Accelerate counts every machine's processes; torchrun counts per node
        out["num_processes"] = processes
    elif dtype == "NO":
        out["num_processes"] = 1
    return out, notes


def hardware_keys(distributed_type: str) -> tuple[dict[str, str | None], list[str]]:
    """Accelerate config keys the adapters for `distributed_type` declare, and those adapters' names.

    An adapter whose `data_parallel_name` is `distributed_type` may set `accelerate_config_keys`, a
    mapping of Accelerate key -> None (harmless here: warned about and ignored) or the reason the key
    is refused. A broken plugin counts as absent (the registry reports it).
    """
    from ..adapter.registry import installed_adapters

    keys: dict[str, str | None] = {}
    names: list[str] = []
    for name, cls in sorted(installed_adapters().items()):
        if getattr(cls, "data_parallel_name", None) == distributed_type:
            names.append(name)
            keys.update(getattr(cls, "accelerate_config_keys", None) or {})
    return keys, names


class _AdapterKeys:
    """The installed adapters' `accelerate_config_settings`, asked for each key the core does not read (the
    adapters are looked up once, at the first such key)."""

    def __init__(self) -> None:
        self._adapters: list[Any] | None = None

    def __call__(self, key: str, value: Any) -> dict[str, Any] | None:
        if self._adapters is None:
            from ..adapter.registry import installed_adapters

            self._adapters = [cls for _name, cls in sorted(installed_adapters().items())]
        for cls in self._adapters:
            try:
                settings = cls.accelerate_config_settings(key, value)
            except ValueError as exc:
                raise SettingError(key, str(exc).removeprefix(f"{key}: ")) from None
            if settings is not None:
                return dict(settings)
        return None


Handler = Callable[[str, Any, dict[str, Any], dict[str, Any], list[str]], None]


def _set(dest: str, convert: Callable[[str, Any], Any] = lambda k, v: v) -> Handler:
    def handle(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
        if value is not None:
            out[dest] = convert(key, value)

    return handle


def _ignore(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    """Keys that change nothing accel does (`same_network`, `distributed_type` handled after)."""


def _compute_environment(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if str(value) != "LOCAL_MACHINE":
        raise SettingError(key, f"{value} launches are not supported; accel runs on LOCAL_MACHINE only")


def _precision(key: str, value: Any) -> str:
    text = str(value).lower()
    if text not in PRECISIONS:
        raise SettingError(key, f"expected one of {', '.join(PRECISIONS)}")
    return text


def _int(key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SettingError(key, f"expected an integer, got {value!r}")
    return value


def _count(key: str, value: Any) -> int:
    """A number of processes or machines: an integer >= 1 (never a default in its place)."""
    if _int(key, value) < 1:
        raise SettingError(key, f"expected an integer >= 1, got {value!r}")
    return value  # type: ignore[no-any-return]


def _port(key: str, value: Any) -> int:
    if not 1 <= _int(key, value) <= 65535:
        raise SettingError(key, f"expected a port number from 1 to 65535, got {value!r}")
    return value  # type: ignore[no-any-return]


def _machine_rank(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    machines = data.get("num_machines", 1)
    machines = machines if isinstance(machines, int) and machines >= 1 else 1  # a bad count fails by its own name
    if value is not None and not 0 <= _int(key, value) < machines:
        raise SettingError(key, f"expected 0 <= machine_rank < num_machines ({machines}), got {value!r}")
    if value is not None:
        out["node_rank"] = value


def _use_cpu(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if as_bool(key, value):
        out["cpu"] = True


def _debug(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if as_bool(key, value):
        out["debug"] = True


def _dynamo(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    if not value:
        return
    if not isinstance(value, dict):
        raise SettingError(key, "expected a mapping of dynamo_* keys")
    for name, setting in dynamo_kwargs(value).items():
        dest = {"fullgraph": "dynamo_use_fullgraph", "dynamic": "dynamo_use_dynamic"}.get(name, "dynamo_" + name)
        out[dest] = setting


def _parallelism(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    """Accelerate's `parallelism_config:` mapping: the workers build their `ParallelismConfig` from it (they
    inherit the launcher's environment; a `--parallelism_config_*` flag wins)."""
    if not value:
        return
    if not isinstance(value, dict):
        raise SettingError(key, "expected a mapping of parallelism_config_* keys")
    from ..strategies.parallelism_config import launch_env

    try:
        env = launch_env(value)
    except ValueError as exc:
        raise SettingError(key, str(exc)) from None
    for name, setting in env.items():
        os.environ.setdefault(name, setting)


def _strategy_section(dtype: str, translate: Callable[[dict[str, Any]], Any]) -> Handler:
    def handle(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
        if not value:
            return
        if not isinstance(value, dict):
            raise SettingError(key, "expected a mapping")
        if str(data.get("distributed_type", "")).upper() != dtype:
            notes.append(f"{key} is ignored: distributed_type is not {dtype} (as in Accelerate)")
            return
        settings = dict(value)
        if dtype == "DEEPSPEED" and "gradient_accumulation_steps" in settings:
            out["gradient_accumulation_steps"] = _int(
                "gradient_accumulation_steps", settings["gradient_accumulation_steps"]
            )
        if dtype == "DEEPSPEED":
            # Accelerate writes "none" for no offload; accel's plugin leaves the field unset.
            settings = {k: v for k, v in settings.items() if not (k.startswith("offload_") and v == "none")}
        result = translate(settings)
        kwargs, more = result if isinstance(result, tuple) else (result, [])
        out["strategy_kwargs"] = kwargs
        notes.extend(f"{key}.{note}" for note in more)

    return handle


# Accelerate's `fp8_config` keys (its `accelerate config` writes the two long spellings) -> ACCEL_FP8_<KEY>.
_FP8_CONFIG_KEYS = {
    "backend": "BACKEND",
    "use_autocast_during_eval": "USE_AUTOCAST_DURING_EVAL",
    "margin": "MARGIN",
    "interval": "INTERVAL",
    "fp8_format": "FORMAT",
    "amax_history_len": "AMAX_HISTORY_LEN",
    "amax_history_length": "AMAX_HISTORY_LEN",
    "amax_compute_algo": "AMAX_COMPUTE_ALGO",
    "amax_compute_algorithm": "AMAX_COMPUTE_ALGO",
    "use_mxfp8_block_scaling": "USE_MXFP8_BLOCK_SCALING",
    "opt_level": "OPT_LEVEL",
    "pad_inner_dim": "PAD_INNER_DIM",
    "enable_fsdp_float8_all_gather": "ENABLE_FSDP_FLOAT8_ALL_GATHER",
}


def _fp8_config(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    """Accelerate's `fp8_config:` mapping: the defaults of the run's fp8 recipe, as `ACCEL_FP8_*` for the workers
    (they inherit the launcher's environment; a variable already set or an `--fp8_*` flag wins)."""
    if not value:
        return
    if not isinstance(value, dict):
        raise SettingError(key, "expected a mapping of fp8 recipe keys")
    env: dict[str, str] = {}
    for name, setting in value.items():
        name = str(name).removeprefix("fp8_") if str(name) != "fp8_format" else "fp8_format"
        if name == "override_linear_precision":
            flags = setting if isinstance(setting, (list, tuple)) else [setting] * 3
            if len(flags) != 3:
                raise SettingError(key, f"{name}: expected three booleans (fprop, dgrad, wgrad), got {setting!r}")
            for part, flag in zip(("FPROP", "DGRAD", "WGRAD"), flags):
                env[f"ACCEL_FP8_OVERRIDE_{part}"] = str(flag).lower()
        elif name in _FP8_CONFIG_KEYS:
            env["ACCEL_FP8_" + _FP8_CONFIG_KEYS[name]] = (
                str(setting).lower() if isinstance(setting, bool) else str(setting)
            )
        else:
            raise SettingError(key, f"{name!r} is not an fp8 recipe key; accel reads {', '.join(_FP8_CONFIG_KEYS)}")
    for name, setting in env.items():
        os.environ.setdefault(name, setting)


def _refuse_when_set(instead: str) -> Handler:
    def handle(key: str, value: Any, data: dict[str, Any], out: dict[str, Any], notes: list[str]) -> None:
        if not _is_off(value):
            raise SettingError(key, instead)

    return handle


_HANDLERS: dict[str, Handler] = {
    "compute_environment": _compute_environment,
    "distributed_type": _ignore,
    "same_network": _ignore,
    "mixed_precision": _set("mixed_precision", _precision),
    "use_cpu": _use_cpu,
    "debug": _debug,
    "num_processes": _ignore,  # per node, once num_machines is known (above)
    "num_machines": _set("nnodes", lambda k, v: str(_count(k, v))),
    "machine_rank": _machine_rank,
    "main_process_ip": _set("master_addr", lambda k, v: check_host(k, str(v))),
    "main_process_port": _set("master_port", _port),
    "rdzv_backend": _set("rdzv_backend", lambda k, v: str(v)),
    "dynamo_config": _dynamo,
    "fsdp_config": _strategy_section("FSDP", fsdp_kwargs),
    "deepspeed_config": _strategy_section("DEEPSPEED", deepspeed_file_kwargs),
    "megatron_lm_config": _strategy_section("MEGATRON_LM", megatron_kwargs),
    "gpu_ids": _set("gpu_ids", lambda k, v: str(v)),  # "all" (Accelerate's default) restricts nothing
    "enable_cpu_affinity": _refuse_when_set("bind the processes with numactl or taskset around `accel launch`"),
    "fp8_config": _fp8_config,
    "parallelism_config": _parallelism,
    "mpirun_config": _refuse_when_set("run `mpirun -np N python train.py` yourself (docs/launching.md)"),
    "main_training_function": _refuse_when_set(
        "accel launch runs the script as __main__ on every process: call that function there (or drop the key)"
    ),
}
