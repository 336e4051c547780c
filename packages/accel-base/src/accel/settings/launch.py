"""Read what a launcher told this process: rank, world size, local rank, rendezvous address.

torchrun, `accel launch`, SLURM's `srun` and MPI launchers each spell these differently.
They are parsed here into one frozen dataclass, from the mapping `accel.settings.env.read_env`
read; nothing deeper in the code reads the environment for them.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SettingError


@dataclass(kw_only=True, frozen=True)
class LaunchInfo:
    """Where this process stands in the job, as its launcher described it."""

    world_size: int = 1
    """Number of processes in the job. More than one means the job runs distributed."""
    rank: int = 0
    """Global index of this process."""
    local_rank: int = 0
    """Index of this process on its node; picks the device."""
    local_world_size: int = 1
    """Processes on this node."""
    master_addr: str = "127.0.0.1"
    """Host of the rendezvous store (rank 0 or the launcher's agent)."""
    master_port: int = 29500
    """Port of the rendezvous store."""
    restart_count: int = 0
    """How many times an elastic launcher restarted the workers; scopes the store keys."""
    use_agent_store: bool = False
    """True when torchrun's agent hosts the store and every rank is a client."""
    launcher: str = "none"
    """Which launcher set the variables: torchrun, slurm, mpi or none."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of `names` set (non-empty) in `env`, and its value."""
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return name, value  # type: ignore[return-value]
    return None


def _count(name: str, text: str, low: int, high: int | None = None, meaning: str = "") -> int:
    """`text` (the value of the variable `name`) as an int in [low, high].

    Raises:
        SettingError: naming the variable, the range and the value.
    """
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise SettingError(
            name,
            f"expected {bound}{meaning}, got {text!r}; it comes from the launcher (torchrun, accel launch, srun, "
            "mpirun): launch through one, or fix or unset the variable",
        )
    return value


def _ranks(
    world: tuple[str, str],
    rank: tuple[str, str],
    local: tuple[str, str] | None,
    local_size: tuple[str, str] | None,
) -> tuple[int, int, int, int]:
    """World size, rank, local rank and local world size, each range-checked against the others."""
    world_size = _count(*world, 1, meaning=" (the number of processes)")
    global_rank = _count(*rank, 0, world_size - 1, meaning=f" (this process's rank; {world[0]}={world_size})")
    local_world = (
        _count(*local_size, 1, world_size, meaning=f" (processes on this node; {world[0]}={world_size})")
        if local_size
        else world_size
    )
    if local is None:
        local_rank = 0
    elif local_size is None:  # only its sign is known wrong: one process may pick a device by LOCAL_RANK alone
        local_rank = _count(*local, 0, meaning=" (this process's index on its node)")
    else:
        local_rank = _count(*local, 0, local_world - 1, meaning=" (this process's index on its node)")
    return world_size, global_rank, local_rank, local_world


def check_host(name: str, text: str) -> str:
    """`text` as the host of a rendezvous: an IPv4/IPv6 address or a host name (letters, digits, `-`, `_`, dots).

    Raises:
        SettingError: naming `name` (the variable, flag or config key) and the value.
    """
    host = text.strip()
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
        return host
    except ValueError:
        pass
    if not (0 < len(host) <= 253 and all(_LABEL.fullmatch(label) for label in host.rstrip(".").split("."))):
        raise SettingError(name, f"expected a host name or an IP address of the main node, got {text!r}")
    return host


_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def parse_launch(env: Mapping[str, str]) -> LaunchInfo:
    """Parse the launcher's variables in `env` (torchrun/accel launch, SLURM, Open MPI, MPICH/Intel MPI).

    torchrun's `WORLD_SIZE`/`RANK` win when present, because `accel launch` and torchrun
    inside a SLURM allocation set both and torchrun's are the ones that describe the workers.

    Raises:
        SettingError: a variable out of its range (`WORLD_SIZE` >= 1, 0 <= `RANK` < `WORLD_SIZE`,
            0 <= `LOCAL_RANK` < `LOCAL_WORLD_SIZE` <= `WORLD_SIZE`, `MASTER_PORT` 1-65535, a `MASTER_ADDR`
            that is no host name or address, and the same for SLURM's and MPI's variables), naming it.
    """

    def where() -> dict[str, Any]:  # read under a launcher only: a one-process run uses neither
        return {
            "master_addr": check_host("MASTER_ADDR", env.get("MASTER_ADDR") or "127.0.0.1"),
            "master_port": _count("MASTER_PORT", env.get("MASTER_PORT") or "29500", 1, 65535, " (a TCP port)"),
        }

    if "WORLD_SIZE" in env and "RANK" in env:
        world, rank, local, local_world = _ranks(
            ("WORLD_SIZE", env["WORLD_SIZE"]),
            ("RANK", env["RANK"]),
            _first(env, "LOCAL_RANK"),
            _first(env, "LOCAL_WORLD_SIZE"),
        )
        return LaunchInfo(
            world_size=world,
            rank=rank,
            local_rank=local,
            local_world_size=local_world,
            restart_count=_count("TORCHELASTIC_RESTART_COUNT", env.get("TORCHELASTIC_RESTART_COUNT") or "0", 0),
            use_agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            launcher="torchrun",
            **where(),
        )
    slurm_world = _first(env, "SLURM_NTASKS")
    slurm_rank = _first(env, "SLURM_PROCID")
    if slurm_world is not None and slurm_rank is not None:
        world, rank, local, local_world = _ranks(
            slurm_world, slurm_rank, _first(env, "SLURM_LOCALID"), _first(env, "SLURM_NTASKS_PER_NODE")
        )
        return LaunchInfo(
            world_size=world, rank=rank, local_rank=local, local_world_size=local_world, launcher="slurm", **where()
        )
    mpi_world = _first(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
    if mpi_world is not None:
        world, rank, local, local_world = _ranks(
            mpi_world,
            _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK") or ("RANK", "0"),
            _first(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"),
            _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"),
        )
        return LaunchInfo(
            world_size=world, rank=rank, local_rank=local, local_world_size=local_world, launcher="mpi", **where()
        )
    return LaunchInfo()


PROGRESS_DIR_ENV = "ACCEL_LAUNCH_PROGRESS_DIR"
"""The folder `accel launch`'s progress line watches (`accel.commands.launch_progress`)."""


def mark_ready(local_rank: int) -> None:
    """Record that this worker is up (accel's state built, the process group joined); a no-op outside `accel launch`."""
    folder = os.environ.get(PROGRESS_DIR_ENV)
    if folder:
        try:
            (Path(folder) / f"ready-{local_rank}").touch()
        except OSError:
            pass  # the launcher removed the folder: it is no longer listening
