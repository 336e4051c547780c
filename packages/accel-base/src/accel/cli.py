"""The `accel` command: `launch`, `config`, `env`, `test`, `merge-weights`, `estimate-memory`.

Each subcommand lives in `accel.commands`. A user's mistake (a bad flag, a missing script,
an unknown adapter, a config key accel cannot honour) is one line on stderr and exit code
2, never a traceback; a worker that fails shows its own traceback and the launcher exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .commands import UsageError
from .commands.env import env_report
from .commands.launch import (
    ACCEL_FLAGS_TO_ENV,
    WORKER_BOOTSTRAP,
    build_torchrun_argv,
    launch,
    worker_env,
)
from .commands.launch import launch_parser as _launch_parser
from .compat.settings import SettingError
from .errors import AdapterNotFoundError, AdapterUnavailableError, CheckpointError, StrategyNotFoundError
from .settings.config_file import ConfigError

__all__ = [
    "ACCEL_FLAGS_TO_ENV",
    "WORKER_BOOTSTRAP",
    "_launch_parser",
    "build_torchrun_argv",
    "env_report",
    "launch",
    "main",
    "worker_env",
]

USER_ERRORS = (
    UsageError,
    ConfigError,
    SettingError,
    AdapterNotFoundError,
    StrategyNotFoundError,
    AdapterUnavailableError,
)


def _env(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(prog="accel env", description="Report versions, adapters and config.").parse_args(argv)
    print(env_report())
    return 0


def _test(argv: Sequence[str]) -> int:
    """`accel test [accel launch flags]`: the 2-process self-check, through `accel launch`."""
    if any(a in ("-h", "--help") for a in argv):
        print(
            "usage: accel test [accel launch flags]\n\nRun accel's self-check (gather, reduce, sharded training) "
            "through `accel launch`, 2 processes unless --num-processes says otherwise. Every flag of "
            "`accel launch` applies (--adapter, --emulate, --main-process-port, --rdzv-endpoint, ...)."
        )
        return 0
    if any(not a.startswith("-") and (i == 0 or not argv[i - 1].startswith("-")) for i, a in enumerate(argv)):
        raise UsageError("accel test runs accel's own self-check: it takes `accel launch` flags, not a script")
    return launch(["--num-processes", "2", *argv, "-m", "accel.commands.selftest"])


def _config(argv: Sequence[str]) -> int:
    from .commands.config import config_command

    return config_command(argv)


def _merge_weights(argv: Sequence[str]) -> int:
    from .commands.merge_weights import merge_weights_command

    return merge_weights_command(argv)


def _estimate_memory(argv: Sequence[str]) -> int:
    from .commands.estimate_memory import estimate_memory_command

    return estimate_memory_command(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "launch": (launch, "run a training script on N processes (torchrun underneath)"),
    "config": (_config, "write, show or update the config file `accel launch` reads"),
    "env": (_env, "report versions, adapters, optional packages and the config file"),
    "test": (_test, "self-check this installation on 2 processes"),
    "merge-weights": (_merge_weights, "merge a sharded checkpoint (FSDP2, DeepSpeed) into one safetensors file"),
    "estimate-memory": (_estimate_memory, "memory per process of a model under DDP, FSDP2 and ZeRO-1/2/3"),
}


def main_parser() -> argparse.ArgumentParser:
    """The top-level parser (its help lists the subcommands)."""
    parser = argparse.ArgumentParser(prog="accel", description="One PyTorch training loop for every accelerator.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `accel ARGV`; the exit code (2 for a usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        main_parser().print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        main_parser().error(f"unknown command {command!r} (choose from {', '.join(COMMANDS)})")
    try:
        return COMMANDS[command][0](rest)
    except USER_ERRORS as exc:
        print(f"accel {command}: error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:  # a damaged or unsafe checkpoint: not a usage mistake, still no traceback
        print(f"accel {command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
