"""`accel launch`: a thin layer over torchrun (`torch.distributed.run`), run in this process.

The parser takes torchrun's process flags, accel's own, every installed adapter's, and
every `accelerate launch` flag (`accelerate_flags.py`) under both spellings. `resolve`
fills what the command line left unset from a config file and the hardware, and refuses
impossible requests with a `UsageError` before anything starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import registry
from ..accelerate_settings import SettingError, deepspeed_kwargs, dynamo_kwargs, fsdp_kwargs, megatron_kwargs
from . import CliParser, UsageError, add_flag
from .accelerate_flags import (
    DEEPSPEED_FLAGS,
    DYNAMO_FLAGS,
    FSDP_FLAGS,
    MEGATRON_FLAGS,
    add_accelerate_flags,
    given,
)

WORKER_BOOTSTRAP = Path(__file__).parents[1] / "worker_bootstrap.py"

ACCEL_FLAGS_TO_ENV = {
    "adapter": "ACCEL_ADAPTER",
    "mixed_precision": "ACCEL_MIXED_PRECISION",
    "gradient_accumulation_steps": "ACCEL_GRADIENT_ACCUMULATION_STEPS",
    "strategy": "ACCEL_STRATEGY",
    "dynamo_backend": "ACCEL_DYNAMO_BACKEND",
    "timeout": "ACCEL_TIMEOUT",
}
# Strategies whose code needs a package accel-base does not depend on: (module, pip requirement).
STRATEGY_REQUIRES = {
    "deepspeed": ("deepspeed", "accel-base[deepspeed]"),
    "megatron": ("megatron.core", "accel-megatron"),
}


def launch_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `accel launch` parser, with every installed adapter's own flags.

    The selected adapter's flags (from `--adapter`/`--cpu` in `argv`, else `ACCEL_ADAPTER`)
    are added first; another adapter whose flags clash with flags already present is left
    out rather than breaking the command (`accel launch --adapter NAME --help` shows it).
    """
    p = CliParser(
        prog="accel launch",
        usage="accel launch [flags] script [script args]",
        description="Run a training script on N processes per node through torch.distributed.run (torchrun).",
    )
    add_flag(p, "config-file", help="an accel or Accelerate config file (default: ACCEL_CONFIG_FILE, then accel's)")
    add_flag(p, "quiet", action="store_true", help="hide torchrun's informational messages")
    p.add_argument("-q", dest="quiet", action="store_true", help=argparse.SUPPRESS)
    g = p.add_argument_group("processes (passed to torchrun)")
    add_flag(
        g,
        "num-processes",
        "nproc-per-node",
        type=int,
        default=None,
        help="processes per node (default: the devices the selected adapter sees; 1 on CPU)",
    )
    add_flag(g, "nnodes", default=None, help="number of nodes, or MIN:MAX for elastic jobs")
    add_flag(
        g,
        "num-machines",
        type=int,
        default=None,
        help="number of nodes, Accelerate's way: --num-processes then counts every node's processes",
    )
    add_flag(g, "node-rank", "machine-rank", type=int, default=None, help="rank of this node (static rendezvous)")
    add_flag(g, "master-addr", "main-process-ip", default=None, help="address of node 0")
    add_flag(g, "master-port", "main-process-port", type=int, default=None, help="port on node 0")
    add_flag(g, "rdzv-backend", default=None, help="torchrun rendezvous backend (c10d, static)")
    add_flag(g, "rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    add_flag(g, "rdzv-id", default=None, help="job id shared by all nodes")
    add_flag(g, "rdzv-conf", default=None, help="torchrun's rendezvous options (KEY=VALUE,...)")
    add_flag(g, "max-restarts", type=int, default=0, help="elastic restarts after a worker fails")
    add_flag(g, "monitor-interval", type=float, default=None, help="seconds between worker health checks")
    add_flag(g, "log-dir", default=None, help="torchrun's per-worker log directory")
    add_flag(g, "role", default=None, help="torchrun's worker role name")
    g.add_argument("-t", "--tee", default=None, help="torchrun's --tee (e.g. 3 for stdout and stderr)")
    g.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    add_flag(g, "no-python", action="store_true", help="run the script directly, not through python")
    add_flag(
        g,
        "num-cpu-threads-per-process",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of each process (default on CPU: cores / processes when several, else unset)",
    )

    a = p.add_argument_group("accel")
    a.add_argument("--adapter", default=None, help="adapter to use (default: the best available)")
    a.add_argument("--emulate", action="store_true", help="run the adapter's code on the CPU with gloo")
    a.add_argument("--cpu", action="store_true", help="use the built-in cpu adapter")
    add_flag(a, "mixed-precision", choices=["no", "bf16", "fp16", "fp8"], default=None)
    add_flag(a, "gradient-accumulation-steps", type=int, default=None)
    a.add_argument("--strategy", default=None, help="ddp (default), fsdp2, deepspeed, or another registered strategy")
    add_flag(a, "dynamo-backend", default=None, help="torch.compile backend, or 'no'")
    a.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds (default 1800)")
    a.add_argument("--debug", action="store_true", help="check tensor shapes and dtypes across ranks in collectives")

    add_accelerate_flags(p)
    _add_adapter_flags(p, _requested_adapter(argv))
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _add_adapter_flags(p: argparse.ArgumentParser, selected: str | None) -> None:
    adapters = sorted(registry.installed_adapters().items(), key=lambda item: (item[0] != selected, item[0]))
    p.set_defaults(_adapter_dests={})
    for name, cls in adapters:
        probe = argparse.ArgumentParser(add_help=False)
        cls.add_launch_arguments(probe.add_argument_group(name))
        flags = {opt for action in probe._actions for opt in action.option_strings}
        if flags & set(p._option_string_actions):
            continue
        group = p.add_argument_group(f"adapter {name!r} (with --adapter {name})")
        cls.add_launch_arguments(group)
        # Which flags belong to which adapter: a flag of an adapter that is not selected is refused.
        p.get_default("_adapter_dests")[name] = {a.dest: a.option_strings[0] for a in group._group_actions}


def _requested_adapter(argv: Sequence[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--adapter", default=None)
    pre.add_argument("--cpu", action="store_true")
    known, _ = pre.parse_known_args(list(argv))
    return "cpu" if known.cpu else (known.adapter or os.environ.get("ACCEL_ADAPTER"))


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Fill unset values (config file, then the hardware) and check the request can run.

    Raises:
        UsageError: what is wrong with the command line and what to do instead.
    """
    from .config import launch_defaults_from_file

    file_values = launch_defaults_from_file(args.config_file)
    if args.cpu or args.adapter:  # the command line chose the hardware: the file's choice does not count
        file_values = {k: v for k, v in file_values.items() if k not in ("cpu", "adapter", "required_hardware")}
    for dest, value in file_values.items():
        if dest != "strategy_kwargs" and getattr(args, dest, None) in (None, False):
            setattr(args, dest, value)
    _accelerate_machines(args)
    if args.module and args.no_python:
        raise UsageError("--module and --no-python cannot be combined: a module always runs through python")
    _check_script(args)
    adapter_cls = _selected_adapter(args)
    hardware = getattr(args, "required_hardware", None)
    if hardware and adapter_cls.name == "cpu" and not args.emulate:
        raise UsageError(
            f"the config file asks for distributed_type {hardware}, but no adapter for that hardware can run here "
            "(`accel env` says why): install its accel adapter, or pass --cpu to run on the CPU"
        )
    _refuse_other_adapters_flags(args, parser, adapter_cls.name)
    args.strategy = _strategy(args)
    args.strategy_kwargs = {**file_values.get("strategy_kwargs", {}), **_strategy_kwargs(args)}
    if args.strategy_kwargs:
        from ..accelerate_env import strategy_config_from_json

        try:  # fail here, in one line, rather than in every worker
            strategy_config_from_json(args.strategy or "ddp", json.dumps(args.strategy_kwargs))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"the {args.strategy} settings are invalid: {exc}") from None
    args.dynamo_kwargs = dynamo_kwargs(given(args, DYNAMO_FLAGS))
    counted = args.num_processes is None
    if counted:
        args.num_processes = _device_count(adapter_cls, bool(args.emulate))
    _check_numbers(args)
    _check_port(args)
    if counted and not args.quiet:
        what = "device" if args.num_processes > 1 else "process: the adapter counts no devices"
        print(
            f"accel launch: {args.num_processes} process(es), one per {what} ({adapter_cls.name} adapter); "
            "--num-processes N sets it",
            file=sys.stderr,
        )
    return args


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


def _refuse_other_adapters_flags(args: argparse.Namespace, parser: argparse.ArgumentParser, selected: str) -> None:
    for name, dests in args._adapter_dests.items():
        if name == selected:
            continue
        used = [flag for dest, flag in dests.items() if getattr(args, dest, None) != parser.get_default(dest)]
        if used:
            raise UsageError(
                f"{', '.join(used)}: {'flags' if len(used) > 1 else 'a flag'} of the {name!r} adapter, but "
                f"{selected!r} is selected: "
                f"add --adapter {name} (with --emulate to run it on this CPU), or drop the flag(s)"
            )


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
        registry.get_strategy_class(strategy)
        need = STRATEGY_REQUIRES.get(strategy)
        if need and importlib.util.find_spec(need[0].split(".")[0]) is None:
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


def build_torchrun_argv(args: argparse.Namespace, *, launcher_pid: int | None = None) -> list[str]:
    """torchrun's argument list for these `accel launch` arguments.

    With `launcher_pid`, each worker starts through `accel/worker_bootstrap.py`, which ties
    its life to that process (the launcher running torchrun in-process): a launcher killed
    with SIGKILL takes its workers with it instead of leaving them training.
    """
    nnodes = str(args.nnodes or "1")
    argv = [
        "--nproc-per-node",
        str(args.num_processes or 1),
        "--nnodes",
        nnodes,
        "--max-restarts",
        str(args.max_restarts),
    ]
    multi_node = nnodes not in ("1", "1:1")
    if not multi_node and not (args.master_port or args.rdzv_endpoint):
        # One node and no address given: torchrun picks a free port itself.
        argv.append("--standalone")
    else:
        if args.node_rank is not None:
            argv += ["--node-rank", str(args.node_rank)]
        if args.rdzv_endpoint or args.rdzv_backend == "c10d":
            endpoint = args.rdzv_endpoint or f"{args.master_addr or '127.0.0.1'}:{args.master_port or 29500}"
            argv += [
                "--rdzv-backend",
                args.rdzv_backend or "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                args.rdzv_id or "accel",
            ]
        else:
            argv += ["--master-addr", args.master_addr or "127.0.0.1", "--master-port", str(args.master_port or 29500)]
            if args.rdzv_backend:
                argv += ["--rdzv-backend", args.rdzv_backend]
    for flag, value in (
        ("--rdzv-conf", args.rdzv_conf),
        ("--monitor-interval", args.monitor_interval),
        ("--log-dir", args.log_dir),
        ("--tee", args.tee),
        ("--role", getattr(args, "role", None)),
    ):
        if value is not None and value != "":
            argv += [flag, str(value)]
    if launcher_pid is not None:
        mode = "module" if args.module else "exec" if args.no_python else "script"
        return [*argv, str(WORKER_BOOTSTRAP), str(launcher_pid), mode, args.script, *args.script_args]
    if args.module:
        argv.append("--module")
    if args.no_python:
        argv.append("--no-python")
    argv.append(args.script)
    argv += args.script_args
    return argv


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment variables the workers inherit from these arguments."""
    env: dict[str, str] = {}
    for attr, var in ACCEL_FLAGS_TO_ENV.items():
        value = getattr(args, attr)
        if value is not None:
            env[var] = str(value)
    if args.cpu:
        env["ACCEL_ADAPTER"] = "cpu"
    if args.emulate:
        env["ACCEL_EMULATE"] = "1"
    if args.debug:
        env["ACCEL_DEBUG_MODE"] = "1"
    if getattr(args, "strategy_kwargs", None):
        env["ACCEL_STRATEGY_CONFIG"] = json.dumps(args.strategy_kwargs)
    for key, value in (getattr(args, "dynamo_kwargs", None) or {}).items():
        if key != "backend":
            env["ACCEL_DYNAMO_" + {"fullgraph": "USE_FULLGRAPH", "dynamic": "USE_DYNAMIC"}.get(key, key.upper())] = str(
                value
            ).lower()
    chosen = env.get("ACCEL_ADAPTER") or os.environ.get("ACCEL_ADAPTER")
    emulate = args.emulate or os.environ.get("ACCEL_EMULATE", "") in ("1", "true")
    cls = registry.select_adapter(chosen, emulate=bool(emulate))
    env.update(_threads(args, cls, bool(emulate)))
    env.update(cls.launch_env(args))
    return env


def _threads(args: argparse.Namespace, adapter_cls: type[Any], emulate: bool) -> dict[str, str]:
    """OMP_NUM_THREADS for the workers: the flag, else cores / processes for several CPU processes."""
    threads = getattr(args, "num_cpu_threads_per_process", None)
    if threads is not None:
        return {"OMP_NUM_THREADS": str(threads)}
    nproc = args.num_processes or 1
    on_cpu = emulate or adapter_cls.hardware_device_type == "cpu"
    if "OMP_NUM_THREADS" in os.environ or not on_cpu or nproc == 1:
        return {}  # torchrun sets 1 per process for several accelerator processes, as it always did
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"OMP_NUM_THREADS": str(max(1, cores // nproc))}


def launch(argv: Sequence[str]) -> int:
    """Run `accel launch ARGV`; the exit code (1 when a worker failed)."""
    parser = launch_parser(argv)
    args = resolve(parser.parse_args(list(argv)), parser)
    os.environ.update(worker_env(args))
    if args.quiet:
        import logging

        logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(build_torchrun_argv(args, launcher_pid=os.getpid()))
    except ChildFailedError as exc:
        print(f"accel launch: {exc.name} failed:", file=sys.stderr)
        for rank, failure in exc.failures.items():
            print(
                f"  rank {rank}: exit code {failure.exitcode} ({failure.message or 'see the output above'})",
                file=sys.stderr,
            )
        return 1
    except (dist.DistNetworkError, dist.DistStoreError) as exc:
        where = args.rdzv_endpoint or f"{args.master_addr or '127.0.0.1'}:{args.master_port or 29500}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"accel launch: the rendezvous at {where} failed: {first}. Check the address and that the port is "
            "free on node 0 (or pick another with --main-process-port).",
            file=sys.stderr,
        )
        return 1
    return 0
