"""`accel launch`: a thin layer over torchrun (`torch.distributed.run`), run in this process.

The parser takes torchrun's process flags, accel's own, every installed adapter's, and
every `accelerate launch` flag (`accelerate_flags.py`) under both spellings. `resolve`
fills what the command line left unset from a config file and the hardware, and refuses
impossible requests with a `UsageError` before anything starts.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..adapter import registry
from . import CliParser, UsageError, add_flag
from .accelerate_flags import add_accelerate_flags
from .launch_progress import StartupProgress
from .launch_resolve import resolve
from .requirements import STRATEGY_REQUIRES  # noqa: F401  (re-exported: it used to live here)

WORKER_BOOTSTRAP = Path(__file__).parent / "worker_bootstrap.py"

ACCEL_FLAGS_TO_ENV = {
    "adapter": "ACCEL_ADAPTER",
    "mixed_precision": "ACCEL_MIXED_PRECISION",
    "gradient_accumulation_steps": "ACCEL_GRADIENT_ACCUMULATION_STEPS",
    "strategy": "ACCEL_STRATEGY",
    "dynamo_backend": "ACCEL_DYNAMO_BACKEND",
    "timeout": "ACCEL_TIMEOUT",
}


def launch_parser(argv: Sequence[str] = (), *, with_adapters: bool = True) -> argparse.ArgumentParser:
    """The `accel launch` parser, with every installed adapter's own flags (unless `with_adapters` is False).

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
    a.add_argument(
        "--cpu",
        action="store_true",
        help="run on the CPU: the built-in cpu adapter, or the adapter --adapter names when it runs on the CPU",
    )
    add_flag(a, "mixed-precision", choices=["no", "bf16", "fp16", "fp8"], default=None, help="precision of the run")
    add_flag(a, "gradient-accumulation-steps", type=int, default=None, help="micro-batches per optimizer step")
    a.add_argument("--strategy", default=None, help="ddp (default), fsdp2, deepspeed, or another registered strategy")
    add_flag(a, "dynamo-backend", default=None, help="torch.compile backend, or 'no'")
    a.add_argument("--timeout", type=float, default=None, help="collective timeout in seconds (default 1800)")
    a.add_argument("--debug", action="store_true", help="check tensor shapes and dtypes across ranks in collectives")

    add_accelerate_flags(p)
    p.set_defaults(_adapter_dests={})
    if with_adapters:
        _add_adapter_flags(p, _requested_adapter(argv))
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _add_adapter_flags(p: argparse.ArgumentParser, selected: str | None) -> None:
    adapters = sorted(registry.installed_adapters().items(), key=lambda item: (item[0] != selected, item[0]))
    for name, cls in adapters:
        probe = argparse.ArgumentParser(add_help=False)
        try:
            cls.add_launch_arguments(probe.add_argument_group(name))
        except Exception as exc:  # one broken plugin never takes the command down (as the registry does)
            if name == selected:
                raise UsageError(f"the {name!r} adapter's launch flags cannot be declared: {exc}") from None
            print(
                f"accel launch: the {name!r} adapter's flags are left out ({type(exc).__name__}: {exc})",
                file=sys.stderr,
            )
            continue
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


def build_torchrun_argv(args: argparse.Namespace, *, launcher_pid: int | None = None) -> list[str]:
    """torchrun's argument list for these `accel launch` arguments.

    With `launcher_pid`, each worker starts tied to that process (the launcher running torchrun
    in-process, `guarded_worker`): a launcher killed with SIGKILL takes its workers with it instead
    of leaving them training.
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
        return [*argv, *guarded_worker(launcher_pid, args)]
    if args.module:
        argv.append("--module")
    if args.no_python:
        argv.append("--no-python")
    argv.append(args.script)
    argv += args.script_args
    return argv


# Run by `setpriv --pdeathsig KILL` as `sh -c GUARD LAUNCHER_PID COMMAND...`: the death signal is armed, so
# the worker starts only while its parent is still the launcher (it may have died before), tells the progress
# line it started (`worker_bootstrap._mark_started`'s file) and becomes COMMAND: same pid, signals, exit code.
GUARD_SH = (
    'test "$PPID" = "$0" || { echo "accel launch worker: the launcher (pid $0) is gone; not starting $*" >&2; '
    "exit 1; }; "
    '[ -z "$ACCEL_LAUNCH_PROGRESS_DIR" ] || true 2>/dev/null >"$ACCEL_LAUNCH_PROGRESS_DIR/started-${LOCAL_RANK:-0}"; '
    'exec "$@"'
)


def _death_signal_tools() -> tuple[str, str] | None:
    """util-linux's `setpriv` and a POSIX `sh` on Linux when both are on PATH, else None."""
    if not sys.platform.startswith("linux"):
        return None
    setpriv, sh = shutil.which("setpriv"), shutil.which("sh")
    return (setpriv, sh) if setpriv and sh else None


# The check `_death_signal_runner` waits for, started early by `launch` (before torch's launcher is imported) so
# that its few milliseconds pass while that import runs.
_started_probe: list[subprocess.Popen[bytes]] = []


def _start_death_signal_probe() -> None:
    """Start checking in the background that `setpriv --pdeathsig` works; `_death_signal_runner` takes the answer."""
    tools = _death_signal_tools()
    if tools is not None and not _started_probe:
        try:
            _started_probe.append(subprocess.Popen([tools[0], "--pdeathsig", "KILL", "--", tools[1], "-c", ":"]))
        except OSError:
            pass


@functools.cache
def _death_signal_runner() -> tuple[str, str] | None:
    """util-linux's `setpriv` and a POSIX `sh` when both are here and `setpriv --pdeathsig` works, else None."""
    tools = _death_signal_tools()
    if tools is None:
        return None
    if not _started_probe:
        _start_death_signal_probe()
    if not _started_probe:
        return None
    probe = _started_probe.pop()
    try:
        ok = probe.wait(timeout=10) == 0
    except subprocess.TimeoutExpired:
        probe.kill()
        probe.wait()
        ok = False
    return tools if ok else None


def guarded_worker(launcher_pid: int, args: argparse.Namespace) -> list[str]:
    """The tail of torchrun's arguments that starts each worker tied to the launcher `launcher_pid`.

    A launcher killed with SIGKILL takes its workers with it (Linux asks the kernel for SIGKILL when the
    parent dies, `PR_SET_PDEATHSIG`). Where util-linux's `setpriv` runs, it arms that signal and a shell
    execs the worker's command: two tiny programs, a few milliseconds, so a launch costs what torchrun's
    does. Elsewhere `worker_bootstrap.py` does it in Python (one more interpreter start per worker; off
    Linux a thread watches the parent instead). Either way the worker is exactly torchrun's command, with
    torchrun's interpreter (`PYTHON_EXEC`, else this one), and keeps its pid, signals and exit code.
    """
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    mode = "module" if args.module else "exec" if args.no_python else "script"
    runner = _death_signal_runner()
    if runner is not None:
        setpriv, sh = runner
        command = (
            [args.script] if mode == "exec" else [python, "-u", *(["-m"] if mode == "module" else []), args.script]
        )
        return [
            "--no-python",
            setpriv,
            "--pdeathsig",
            "KILL",
            "--",
            sh,
            "-c",
            GUARD_SH,
            str(launcher_pid),
            *command,
            *args.script_args,
        ]
    bootstrap = [str(WORKER_BOOTSTRAP), str(launcher_pid), mode, args.script, *args.script_args]
    if sys.platform.startswith("linux"):
        # The bootstrap only arms the death signal and execs the worker: an isolated interpreter without
        # `site` is all it needs.
        return ["--no-python", python, "-I", "-S", *bootstrap]
    return bootstrap


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment variables the workers inherit from these arguments."""
    env: dict[str, str] = {}
    from_file: set[str] = getattr(args, "from_file", set())
    for attr, var in ACCEL_FLAGS_TO_ENV.items():
        value = getattr(args, attr)
        if value is not None and not (attr in from_file and os.environ.get(var)):  # the environment beats the file
            env[var] = str(value)
    if args.cpu:
        env["ACCEL_ADAPTER"] = "cpu"
    if args.emulate:
        env["ACCEL_EMULATE"] = "1"
    if args.debug:
        env["ACCEL_DEBUG_MODE"] = "1"
    # --parallelism_config_* flags (they win over a config file's parallelism_config mapping).
    env.update(getattr(args, "parallelism_env", None) or {})
    # --gpu_ids: the selected adapter's visible-devices variable (`resolve` checked the adapter has one); a
    # config file's gpu_ids does not override that variable when the user already set it.
    for var, ids in (getattr(args, "visible_devices_env", None) or {}).items():
        if not ("gpu_ids" in from_file and var in os.environ):
            env[var] = ids
    # --fp8_* flags (they win over a config file's fp8_config mapping).
    env.update(getattr(args, "fp8_env", None) or {})
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
    args = resolve(parser.parse_args(list(argv)), parser)  # config file, hardware, checks
    _start_death_signal_probe()  # answered while torch's launcher is imported below
    os.environ.update(worker_env(args))
    if not args.quiet:  # on stderr: the script's stdout stays its own
        print(args.start_line, file=sys.stderr, flush=True)
    if args.quiet:
        import logging

        logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    progress = None if args.quiet else StartupProgress(args.num_processes or 1, args.script)
    if progress is not None:
        os.environ.update(progress.env())
        progress.start()
    # Everything imported so far (torch above all) lives until the launcher exits: moved out of the collector's
    # reach, the full collection at interpreter exit no longer walks it (about 0.35 s of CPU with torch here).
    gc.freeze()
    try:
        torchrun_main(build_torchrun_argv(args, launcher_pid=os.getpid()))
    except ChildFailedError as exc:
        # torchrun names the program it ran (the bootstrap) and, without an error file, points at its
        # own docs: the user's script and "the traceback above" are what the user needs.
        print(f"accel launch: {args.script} failed:", file=sys.stderr)
        for rank, failure in sorted(exc.failures.items()):
            message = failure.message or ""
            if not message or "pytorch.org" in message:
                message = "its traceback is above" if failure.exitcode > 0 else "see the output above"
            print(f"  rank {rank}: exit code {failure.exitcode} ({message})", file=sys.stderr)
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
    finally:
        if progress is not None:
            progress.stop()
    return 0
