"""The `accel` command: `launch` (a thin layer over torchrun), `env`, `test`."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from . import registry

WORKER_BOOTSTRAP = Path(__file__).with_name("worker_bootstrap.py")

ACCEL_FLAGS_TO_ENV = {
    "adapter": "ACCEL_ADAPTER",
    "mixed_precision": "ACCEL_MIXED_PRECISION",
    "gradient_accumulation_steps": "ACCEL_GRADIENT_ACCUMULATION_STEPS",
    "strategy": "ACCEL_STRATEGY",
    "dynamo_backend": "ACCEL_DYNAMO_BACKEND",
    "timeout": "ACCEL_TIMEOUT",
}


def _launch_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The `accel launch` parser, with every installed adapter's own flags.

    The selected adapter's flags (from `--adapter`/`--cpu` in `argv`, else `ACCEL_ADAPTER`)
    are added first; another adapter whose flags clash with flags already present is left
    out rather than breaking the command (`accel launch --adapter NAME --help` shows it).
    """
    p = argparse.ArgumentParser(
        prog="accel launch",
        description="Run a training script on N processes per node through torch.distributed.run (torchrun).",
    )
    g = p.add_argument_group("processes (passed to torchrun)")
    g.add_argument(
        "--num-processes",
        "--num_processes",
        "--nproc-per-node",
        dest="num_processes",
        type=int,
        default=1,
        help="processes per node (default 1)",
    )
    g.add_argument("--nnodes", default="1", help="number of nodes, or MIN:MAX for elastic jobs")
    g.add_argument(
        "--node-rank",
        "--node_rank",
        dest="node_rank",
        type=int,
        default=None,
        help="rank of this node (static rendezvous)",
    )
    g.add_argument("--master-addr", "--main-process-ip", dest="master_addr", default=None, help="address of node 0")
    g.add_argument(
        "--master-port", "--main-process-port", dest="master_port", type=int, default=None, help="port on node 0"
    )
    g.add_argument(
        "--rdzv-backend", dest="rdzv_backend", default=None, help="torchrun rendezvous backend (c10d, static)"
    )
    g.add_argument("--rdzv-endpoint", dest="rdzv_endpoint", default=None, help="HOST:PORT of the rendezvous")
    g.add_argument("--rdzv-id", dest="rdzv_id", default=None, help="job id shared by all nodes")
    g.add_argument("--rdzv-conf", dest="rdzv_conf", default=None)
    g.add_argument(
        "--max-restarts", dest="max_restarts", type=int, default=0, help="elastic restarts after a worker fails"
    )
    g.add_argument("--monitor-interval", dest="monitor_interval", type=float, default=None)
    g.add_argument("--log-dir", dest="log_dir", default=None, help="torchrun's per-worker log directory")
    g.add_argument("--tee", default=None, help="torchrun's --tee (e.g. 3 for stdout and stderr)")
    g.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    g.add_argument(
        "--no-python", dest="no_python", action="store_true", help="run the script directly, not through python"
    )

    a = p.add_argument_group("accel")
    a.add_argument("--adapter", default=None, help="adapter to use (default: the best available)")
    a.add_argument("--emulate", action="store_true", help="run the adapter's code on the CPU with gloo")
    a.add_argument("--cpu", action="store_true", help="use the built-in cpu adapter")
    a.add_argument(
        "--mixed-precision",
        "--mixed_precision",
        dest="mixed_precision",
        choices=["no", "bf16", "fp16", "fp8"],
        default=None,
    )
    a.add_argument("--gradient-accumulation-steps", dest="gradient_accumulation_steps", type=int, default=None)
    a.add_argument("--strategy", default=None, help="ddp (default), fsdp2, deepspeed, or another registered strategy")
    a.add_argument("--dynamo-backend", dest="dynamo_backend", default=None, help="torch.compile backend, or 'no'")
    a.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds (default 1800)")
    a.add_argument("--debug", action="store_true", help="check tensor shapes across ranks before collectives")

    selected = _requested_adapter(argv)
    adapters = sorted(registry.installed_adapters().items(), key=lambda item: (item[0] != selected, item[0]))
    for name, cls in adapters:
        probe = argparse.ArgumentParser(add_help=False)
        cls.add_launch_arguments(probe.add_argument_group(name))
        flags = {opt for action in probe._actions for opt in action.option_strings}
        if flags & set(p._option_string_actions):
            continue
        cls.add_launch_arguments(p.add_argument_group(f"adapter {name!r}"))

    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _requested_adapter(argv: Sequence[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--adapter", default=None)
    pre.add_argument("--cpu", action="store_true")
    known, _ = pre.parse_known_args(list(argv))
    return "cpu" if known.cpu else (known.adapter or os.environ.get("ACCEL_ADAPTER"))


def build_torchrun_argv(args: argparse.Namespace, *, launcher_pid: int | None = None) -> list[str]:
    """torchrun's argument list for these `accel launch` arguments.

    With `launcher_pid`, each worker starts through `accel/worker_bootstrap.py`, which ties
    its life to that process (the launcher running torchrun in-process): a launcher killed
    with SIGKILL takes its workers with it instead of leaving them training.
    """
    argv = [
        "--nproc-per-node",
        str(args.num_processes),
        "--nnodes",
        str(args.nnodes),
        "--max-restarts",
        str(args.max_restarts),
    ]
    multi_node = str(args.nnodes) not in ("1", "1:1")
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
    if args.rdzv_conf:
        argv += ["--rdzv-conf", args.rdzv_conf]
    if args.monitor_interval is not None:
        argv += ["--monitor-interval", str(args.monitor_interval)]
    if args.log_dir:
        argv += ["--log-dir", args.log_dir]
    if args.tee:
        argv += ["--tee", args.tee]
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
    chosen = env.get("ACCEL_ADAPTER") or os.environ.get("ACCEL_ADAPTER")
    emulate = args.emulate or os.environ.get("ACCEL_EMULATE", "") in ("1", "true")
    cls = registry.select_adapter(chosen, emulate=bool(emulate))
    env.update(cls.launch_env(args))
    return env


def launch(argv: Sequence[str]) -> int:
    args = _launch_parser(argv).parse_args(list(argv))
    os.environ.update(worker_env(args))
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
    return 0


def env_report() -> str:
    """Versions and every installed adapter, available or not and why: made for bug reports."""
    import torch

    lines = [
        f"accel-base: {_version('accel-base')}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"torch: {torch.__version__}",
        f"platform: {platform.platform()}",
        f"cpu cores: {os.cpu_count()}",
        "",
        "adapters:",
    ]
    for name, rec in sorted(registry.adapter_records().items()):
        if not rec.ok:
            lines.append(f"  {name:<10} BROKEN      {rec.distribution}: {rec.error}")
            continue
        cls = rec.loaded
        avail = registry.availability(cls)
        status = "available" if avail else "unavailable"
        lines.append(
            f"  {name:<10} {status:<11} priority={cls.priority} device={cls.hardware_device_type} "
            f"backend={cls.hardware_backend} ({rec.distribution} {_version(rec.distribution)})"
            + (f": {avail.reason}" if avail.reason else "")
        )
    try:
        selected = registry.select_adapter(
            os.environ.get("ACCEL_ADAPTER") or None, emulate=os.environ.get("ACCEL_EMULATE") == "1"
        )
        lines.append(f"selected: {selected.name}")
    except Exception as exc:  # report, do not fail: this is a diagnostic command
        lines.append(f"selected: error: {exc}")
    lines += ["", "strategies:"]
    for name, rec in sorted(registry.strategy_records().items()):
        lines.append(f"  {name:<10} " + (f"ok ({rec.distribution})" if rec.ok else f"BROKEN: {rec.error}"))
    accel_vars = {k: v for k, v in os.environ.items() if k.startswith("ACCEL_")}
    if accel_vars:
        lines += ["", "environment:"] + [f"  {k}={v}" for k, v in sorted(accel_vars.items())]
    return "\n".join(lines)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="accel", description="One PyTorch training loop for every accelerator.")
    parser.add_argument(
        "command", choices=["launch", "env", "test"], help="launch a script, report the environment, or self-test"
    )
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "launch":
        return launch(rest)
    if command == "env":
        print(env_report())
        return 0
    if command == "test":
        test_args = argparse.ArgumentParser(prog="accel test")
        test_args.add_argument("--num-processes", type=int, default=2)
        test_args.add_argument("--adapter", default=None)
        test_args.add_argument("--emulate", action="store_true")
        ns = test_args.parse_args(rest)
        launch_argv = ["--num-processes", str(ns.num_processes)]
        if ns.adapter:
            launch_argv += ["--adapter", ns.adapter]
        if ns.emulate:
            launch_argv.append("--emulate")
        return launch([*launch_argv, "-m", "accel.selftest"])
    parser.error(f"unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
