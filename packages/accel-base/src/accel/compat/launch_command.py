"""`accelerate.commands.launch`'s programmatic entry points, on `accel launch` (trl's CLI calls them).

    args = launch_command_parser().parse_args(["--num_processes", "2", "train.py", "--lr", "1e-3"])
    launch_command(args)

Under `accel.as_accelerate` these are what `from accelerate.commands.launch import launch_command,
launch_command_parser` gives: the arguments are `accel launch`'s (which accepts `accelerate launch`'s
flags), and the workers inherit the alias through PYTHONPATH.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ..commands.launch import launch


class LaunchArguments(list[str]):
    """The command line for `accel launch`, as `launch_command_parser().parse_args` returns it."""


class LaunchCommandParser:
    """Collects a command line for `launch_command`; `accel launch` parses and checks it when it runs."""

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> LaunchArguments:
        """`args` (default: `sys.argv[1:]`) as `LaunchArguments`."""
        return LaunchArguments(sys.argv[1:] if args is None else args)


def launch_command_parser(subparsers: Any = None) -> LaunchCommandParser:
    """A parser for `launch_command`'s arguments (Accelerate's `subparsers` argument is accepted and unused)."""
    return LaunchCommandParser()


def launch_command(args: LaunchArguments) -> None:
    """Run `accel launch` with `args`; raises SystemExit with its exit code when a worker failed."""
    if not isinstance(args, LaunchArguments):
        raise TypeError("launch_command takes what launch_command_parser().parse_args([...]) returns")
    code = launch(list(args))
    if code:
        raise SystemExit(code)
