"""Read what a launcher told this process: rank, world size, local rank, rendezvous address.

torchrun, `accel launch`, SLURM's `srun` and MPI launchers each spell these differently.
They are parsed here into one frozen dataclass, from the mapping `accel.settings.env.read_env`
read; nothing deeper in the code reads the environment for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


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


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return value
    return None


def parse_launch(env: Mapping[str, str]) -> LaunchInfo:
    """Parse the launcher's variables in `env` (torchrun/accel launch, SLURM, Open MPI, MPICH/Intel MPI).

    torchrun's `WORLD_SIZE`/`RANK` win when present, because `accel launch` and torchrun
    inside a SLURM allocation set both and torchrun's are the ones that describe the workers.
    """
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "29500"))
    restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"

    if "WORLD_SIZE" in env and "RANK" in env:
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        return LaunchInfo(
            world_size=world,
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=local_world,
            master_addr=addr,
            master_port=port,
            restart_count=restart,
            use_agent_store=agent,
            launcher="torchrun",
        )
    slurm_world = _first(env, "SLURM_NTASKS")
    if slurm_world is not None and _first(env, "SLURM_PROCID") is not None:
        return LaunchInfo(
            world_size=int(slurm_world),
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            local_world_size=int(_first(env, "SLURM_NTASKS_PER_NODE") or slurm_world),
            master_addr=addr,
            master_port=port,
            launcher="slurm",
        )
    mpi_world = _first(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")
    if mpi_world is not None:
        rank = _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK") or "0"
        local = _first(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
        local_size = _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
        return LaunchInfo(
            world_size=int(mpi_world),
            rank=int(rank),
            local_rank=int(local or "0"),
            local_world_size=int(local_size or mpi_world),
            master_addr=addr,
            master_port=port,
            launcher="mpi",
        )
    return LaunchInfo()
