"""`accel launch`: what the command line left unset (config file, hardware) and what it cannot ask for.

`resolve` runs before anything starts: each impossible request is a `UsageError` saying what to
do instead, printed in one line by the CLI (exit code 2).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from ..adapter import registry
from ..compat.config_file import hardware_keys
from ..compat.settings import SettingError, deepspeed_kwargs, dynamo_kwargs, fsdp_kwargs, megatron_kwargs
from ..settings.launch import check_host
from . import UsageError
from .accelerate_flags import (
    DEEPSPEED_FLAGS,
    DYNAMO_FLAGS,
    FSDP_FLAGS,
    MEGATRON_FLAGS,
    given,
)
from .requirements import STRATEGY_REQUIRES, installed


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill unset values (config file, then the hardware) and check the request can run.

    Raises:
        UsageError: what is wrong with the command line and what to do instead.
    """
    from .config import find_config_file, launch_defaults_from_file

    path, args.config_source = find_config_file(args.config_file)
    if path is not None and not args.config_file and args.config_source.startswith("Accelerate") and not args.quiet:
        print(f"accel launch: using {args.config_source} (accel has no config file of its own)", file=sys.stderr)
    file_values = launch_defaults_from_file(args.config_file, path) if path is not None else {}
    if args.cpu or args.adapter:  # the command line chose the hardware: the file's choice does not count
        file_values = {k: v for k, v in file_values.items() if k not in ("cpu", "adapter", "required_hardware")}
    asked = _command_line_strategy(args)
    if asked is not None:  # a strategy flag replaces the file's strategy (and its settings, unless the same one)
        if file_values.get("strategy") not in (None, asked):
            file_values.pop("strategy_kwargs", None)
        file_values.pop("strategy", None)
    args.from_file = set()  # what the file filled: a variable the user already set wins over it (worker_env)
    for dest, value in file_values.items():
        if dest != "strategy_kwargs" and getattr(args, dest, None) in (None, False):
            setattr(args, dest, value)
            args.from_file.add(dest)
    _accelerate_machines(args)
    if args.cpu and args.adapter not in (None, "cpu") and _runs_on_the_cpu(args.adapter):
        args.cpu = False  # `--cpu` asks for the CPU, and the adapter named runs there
    if args.cpu and args.adapter not in (None, "cpu"):
        raise UsageError(f"--cpu and --adapter {args.adapter} ask for different hardware; give one of them")
    if args.module and args.no_python:
        raise UsageError("--module and --no-python cannot be combined: a module always runs through python")
    _check_script(args)
    hardware = getattr(args, "required_hardware", None)
    if hardware and not (args.cpu or args.adapter or os.environ.get("ACCEL_ADAPTER")):
        # The adapter for the file's hardware type, when exactly one installed adapter reports it.
        owners = hardware_keys(hardware)[1]
        if len(owners) == 1:
            args.adapter = owners[0]
    adapter_cls = _selected_adapter(args)
    if hardware and adapter_cls.name == "cpu" and not args.emulate:
        raise UsageError(
            f"the config file asks for distributed_type {hardware}, but no adapter for that hardware can run here "
            "(`accel env` says why): install its accel adapter, or pass --cpu to run on the CPU"
        )
    _refuse_other_adapters_flags(args, parser, adapter_cls.name)
    args.strategy = _strategy(args)
    args.strategy_kwargs = {**file_values.get("strategy_kwargs", {}), **_strategy_kwargs(args)}
    if args.strategy_kwargs:
        from ..compat.env import strategy_config_from_json

        try:  # fail here, in one line, rather than in every worker
            strategy_config_from_json(args.strategy or "ddp", json.dumps(args.strategy_kwargs))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"the {args.strategy} settings are invalid: {exc}") from None
    args.dynamo_kwargs = dynamo_kwargs(given(args, DYNAMO_FLAGS))
    _check_precision(args, adapter_cls)
    _check_dynamo_backend(args, adapter_cls)
    args.visible_devices_env = _visible_devices(args, adapter_cls)
    counted = args.num_processes is None
    if counted:
        visible = next(iter(args.visible_devices_env.values()), None)
        args.num_processes = len(visible.split(",")) if visible else _device_count(adapter_cls, bool(args.emulate))
    _check_numbers(args)
    _check_port(args)
    args.start_line = _start_line(args, adapter_cls, counted)
    return args


def _start_line(args: argparse.Namespace, adapter_cls: type[Any], counted: bool) -> str:
    """The line `accel launch` prints on stderr as it starts the workers: how many, the adapter, the strategy
    and where the settings came from."""
    from ..adapter.base import Adapter

    n = args.num_processes
    count = f"{n} process{'es' if n > 1 else ''}"
    if counted:
        why = f"one per device the {adapter_cls.name} adapter sees" if n > 1 else "no devices counted"
        count += f" ({why}; --num-processes N sets the number)"
    if str(args.nnodes) not in ("1", "1:1"):
        count += f" on each of {args.nnodes} nodes"
    strategy = args.strategy
    if strategy is None:
        default = adapter_cls.default_strategy is Adapter.default_strategy
        strategy = "ddp" if default else "the adapter's default"
    emulated = ", emulated" if args.emulate else ""
    return (
        f"accel launch: starting {count}: adapter {adapter_cls.name}{emulated}, strategy {strategy}, "
        f"{args.config_source}"
    )


def _accelerate_machines(args: argparse.Namespace) -> None:
    """`--num_machines N` is Accelerate's spelling: its `--num_processes` is the total over all nodes."""
    if args.num_machines is None:
        return
    if args.nnodes is not None and str(args.nnodes) != str(args.num_machines):
        raise UsageError("--nnodes and --num-machines disagree; give one of them")
    if args.num_machines < 1:
        raise UsageError(f"--num-machines must be at least 1, got {args.num_machines}")
    args.nnodes = str(args.num_machines)
    if args.num_processes is not None:
        if args.num_processes % args.num_machines:
            raise UsageError(
                f"--num-processes {args.num_processes} (all nodes, with --num-machines) does not split evenly "
                f"over {args.num_machines} machines"
            )
        args.num_processes //= args.num_machines


def _check_script(args: argparse.Namespace) -> None:
    script = args.script
    if args.module:
        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"no module named {script!r} (with -m the script is a module name, importable from here)")
    elif args.no_python:
        if shutil.which(script) is None:
            raise UsageError(f"{script!r} is not an executable on PATH (with --no-python the script is a program)")
    elif not Path(script).is_file():
        raise UsageError(f"the training script {script!r} does not exist (from {os.getcwd()})")


def _selected_adapter(args: argparse.Namespace) -> type[Any]:
    name = "cpu" if args.cpu else (args.adapter or os.environ.get("ACCEL_ADAPTER") or None)
    emulate = args.emulate or os.environ.get("ACCEL_EMULATE", "") in ("1", "true")
    return registry.select_adapter(name, emulate=bool(emulate))


def _runs_on_the_cpu(name: str) -> bool:
    """Whether the installed adapter `name` runs on the CPU itself (an extension of the CPU, not a device)."""
    cls = registry.installed_adapters().get(name)
    return cls is not None and cls.hardware_device_type == "cpu" and cls.name != "cpu"


def _refuse_other_adapters_flags(args: argparse.Namespace, parser: argparse.ArgumentParser, selected: str) -> None:
    for name, dests in args._adapter_dests.items():
        if name == selected:
            continue
        used = [
            flag
            for dest, flag in dests.items()
            if getattr(args, dest, None) != parser.get_default(dest) and dest not in args.from_file
        ]
        if used:
            raise UsageError(
                f"{', '.join(used)}: {'flags' if len(used) > 1 else 'a flag'} of the {name!r} adapter, but "
                f"{selected!r} is selected: "
                f"add --adapter {name} (with --emulate to run it on this CPU), or drop the flag(s)"
            )


def _command_line_strategy(args: argparse.Namespace) -> str | None:
    """The strategy the command line asks for (`--strategy`, `--use_fsdp`, ...), before the config file counts."""
    if args.strategy is not None:
        return str(args.strategy)
    switches = {"deepspeed": args.use_deepspeed, "fsdp2": args.use_fsdp, "megatron": args.use_megatron_lm}
    return next((name for name, on in switches.items() if on), None)


def _strategy(args: argparse.Namespace) -> str | None:
    switches = {"deepspeed": args.use_deepspeed, "fsdp2": args.use_fsdp, "megatron": args.use_megatron_lm}
    chosen = [name for name, on in switches.items() if on]
    if args.strategy is not None:
        chosen = list(dict.fromkeys([args.strategy, *chosen]))
    if len(chosen) > 1:
        raise UsageError(f"choose one strategy; the command line asks for {' and '.join(chosen)}")
    strategy = chosen[0] if chosen else None
    if given(args, FSDP_FLAGS) and strategy != "fsdp2":
        raise UsageError("--fsdp_* flags configure FSDP: add --use_fsdp (or --strategy fsdp2)")
    if given(args, DEEPSPEED_FLAGS) and strategy != "deepspeed":
        raise UsageError("DeepSpeed flags (--zero_stage, --deepspeed_config_file, ...) need --use_deepspeed")
    if given(args, MEGATRON_FLAGS) and strategy != "megatron":
        raise UsageError("--megatron_lm_* flags configure Megatron-LM: add --use_megatron_lm")
    if strategy is not None:
        need = STRATEGY_REQUIRES.get(strategy)
        if need and strategy not in registry.strategy_records():
            raise UsageError(f"the {strategy} strategy is not installed: pip install '{need[1]}'")
        registry.get_strategy_class(strategy)
        if need and not installed(need[0].split(".")[0]):
            raise UsageError(
                f"the {strategy} strategy needs {need[0]}, which is not installed: pip install '{need[1]}'"
            )
    return strategy


def _strategy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    notes: list[str] = []
    try:
        if args.strategy == "fsdp2":
            kwargs, notes = fsdp_kwargs(given(args, FSDP_FLAGS))
        elif args.strategy == "deepspeed":
            kwargs, notes = deepspeed_kwargs(given(args, DEEPSPEED_FLAGS))
        elif args.strategy == "megatron" and given(args, MEGATRON_FLAGS):
            kwargs = megatron_kwargs(given(args, MEGATRON_FLAGS))
        else:
            kwargs = {}
    except SettingError as exc:
        raise UsageError(f"--{exc}") from None
    for note in notes:
        print(f"accel launch: --{note}", file=sys.stderr)
    return kwargs


def _visible_devices(args: argparse.Namespace, adapter_cls: type[Any]) -> dict[str, str]:
    """`--gpu_ids` as the adapter's visible-devices variable for the workers ("all" or unset: nothing)."""
    ids = getattr(args, "gpu_ids", None)
    if ids is None or str(ids).strip().lower() == "all":
        return {}
    ids = ",".join(part.strip() for part in str(ids).split(","))
    if not all(ids.split(",")):
        raise UsageError(f"--gpu_ids takes comma-separated device ids (or all), got {args.gpu_ids!r}")
    variable = adapter_cls.visible_devices_env
    if variable is None:
        raise UsageError(
            f"--gpu_ids {ids}: the {adapter_cls.name!r} adapter has no visible-devices variable to limit its "
            "devices with; drop --gpu_ids (or gpu_ids in the config file), or select the adapter for your devices"
        )
    return {variable: ids}


def _device_count(adapter_cls: type[Any], emulate: bool) -> int:
    """Devices the adapter's vendor module counts (its `device_count()`); 1 where it has none (CPU)."""
    if emulate or adapter_cls.vendor_module is None:
        return 1
    try:
        count = int(importlib.import_module(adapter_cls.vendor_module).device_count())
    except Exception:  # a launcher default, not a failure: the adapter reports problems itself
        return 1
    return max(count, 1)


def _check_numbers(args: argparse.Namespace) -> None:
    if args.num_processes < 1:
        raise UsageError(f"--num-processes must be at least 1, got {args.num_processes}")
    args.nnodes = str(args.nnodes or "1")
    parts = args.nnodes.split(":")
    if not (1 <= len(parts) <= 2 and all(p.isdigit() for p in parts) and 1 <= int(parts[0]) <= int(parts[-1])):
        raise UsageError(f"--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got {args.nnodes!r}")
    if args.node_rank is not None and not 0 <= args.node_rank < int(parts[-1]):
        raise UsageError(f"--node-rank must be between 0 and {int(parts[-1]) - 1} for --nnodes {args.nnodes}")
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError(f"--main-process-port must be a port number (1-65535), got {args.master_port}")
    if args.master_addr is not None:
        check_host("--main-process-ip", args.master_addr)  # a SettingError: one line, exit 2
    if args.gradient_accumulation_steps is not None and args.gradient_accumulation_steps < 1:
        raise UsageError(f"--gradient-accumulation-steps must be >= 1, got {args.gradient_accumulation_steps}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.num_cpu_threads_per_process is not None and args.num_cpu_threads_per_process < 1:
        raise UsageError(f"--num-cpu-threads-per-process must be >= 1, got {args.num_cpu_threads_per_process}")


def _check_port(args: argparse.Namespace) -> None:
    """Refuse a rendezvous port this launcher would host but cannot bind."""
    single = args.nnodes in ("1", "1:1")
    hosts = single or (args.rdzv_backend in (None, "static") and not args.rdzv_endpoint and args.node_rank == 0)
    if args.master_port is None or args.rdzv_endpoint or not hosts:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", args.master_port))
        except OSError as exc:
            raise UsageError(
                f"port {args.master_port} on this machine is in use ({exc.strerror}): pick a free one with "
                "--main-process-port, or leave it out on one node and torchrun picks one"
            ) from None


def _check_precision(args: argparse.Namespace, adapter_cls: type[Any]) -> None:
    """Refuse a precision the selected adapter can never run (its `capabilities.precisions`); one that
    depends on the device model (fp8 on older chips) is still checked by the workers."""
    precision = args.mixed_precision
    supported = adapter_cls.capabilities.precisions
    if precision and precision not in supported:
        raise UsageError(
            f"--mixed-precision {precision}: the {adapter_cls.name!r} adapter does not support it (it runs "
            f"{', '.join(sorted(supported))}); pick one of those, or select an adapter that does with --adapter NAME"
        )


def _check_dynamo_backend(args: argparse.Namespace, adapter_cls: type[Any]) -> None:
    """Refuse a `torch.compile` backend torch does not know, before any worker imports torch._dynamo.

    Vendor libraries may register backends when the workers import them, so under an adapter with a
    vendor module (not emulated) a name torch does not know yet is left to the workers.
    """
    backend = (args.dynamo_backend or "no").lower()
    args.dynamo_backend = None if args.dynamo_backend is None else backend
    if backend in ("no", "default"):
        return
    if adapter_cls.vendor_module is not None and not args.emulate:
        return
    from torch._dynamo import list_backends  # entry-point backends (`torch_dynamo_backends`) included

    known = list_backends(exclude_tags=())
    if backend not in known:
        raise UsageError(
            f"--dynamo-backend {backend}: torch.compile has no backend of that name; use one of "
            f"{', '.join(['no', *sorted(b for b in known if 'TESTING' not in b)])}"
        )
