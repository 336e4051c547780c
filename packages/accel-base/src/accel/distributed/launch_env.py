"""What a launcher told this process (rank, world size, local rank, rendezvous address): `LaunchInfo`,
parsed in `accel.settings` with the rest of the environment."""

from __future__ import annotations

from collections.abc import Mapping

from ..settings.env import read_env
from ..settings.launch import LaunchInfo, parse_launch


def read_launch_env(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """The launcher's variables in `env` (default: this process's environment, now) as a `LaunchInfo`."""
    return read_env().launch if env is None else parse_launch(env)


__all__ = ["LaunchInfo", "read_launch_env"]
