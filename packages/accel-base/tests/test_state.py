"""Process state: shared across instances, always distributed under a launcher, launcher variables parsed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator, DistributedSetupError, DistributedType
from accel.distributed.launch_env import LaunchInfo, read_launch_env
from accel.state import AcceleratorState, GradientState, PartialState

# Reports what the state saw, then proves the group is real with a collective.
STATE_WORKER = """
import json, os, sys
import torch
import torch.distributed as dist
from accel import Accelerator
acc = Accelerator()
t = torch.tensor([10.0 * acc.process_index + 1.0])
report = {
    "num_processes": acc.num_processes,
    "process_index": acc.process_index,
    "local_process_index": acc.local_process_index,
    "distributed_type": acc.distributed_type.value,
    "dist_initialized": dist.is_initialized(),
    "dist_world": dist.get_world_size() if dist.is_initialized() else None,
    "backend": dist.get_backend() if dist.is_initialized() else None,
    "gathered": acc.gather(t).tolist(),
    "launcher": acc.state.launch.launcher,
    "is_main": acc.is_main_process,
}
out = sys.argv[1]
with open(os.path.join(out, f"rank{acc.process_index}.json"), "w") as f:
    json.dump(report, f)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reports(directory: Path) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)]


def _assert_real_two_process_group(reports: list[dict], launcher: str) -> None:
    assert sorted(r["process_index"] for r in reports) == [0, 1]
    for rank, r in enumerate(reports):
        assert r["process_index"] == rank
        assert r["num_processes"] == 2
        assert r["dist_initialized"] is True
        assert r["dist_world"] == 2
        assert r["backend"] == "gloo"
        assert r["distributed_type"] == "MULTI_CPU"
        assert r["launcher"] == launcher
        assert r["is_main"] is (rank == 0)
        # Rank r contributes 10r+1: only a real group yields both contributions on each rank.
        assert r["gathered"] == [1.0, 11.0]


def test_plain_torchrun_runs_distributed_not_one_process_per_rank(write_script, tmp_path: Path) -> None:
    """Accelerate runs each rank alone under plain torchrun on a CPU machine; we must not."""
    script = write_script(STATE_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    cmd.append(str(tmp_path))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCEL_ADAPTER", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _assert_real_two_process_group(_reports(tmp_path), "torchrun")


def test_slurm_variables_alone_start_a_real_group(write_script, tmp_path: Path) -> None:
    """Two processes started as `srun` would start them (no torchrun variables) form one group."""
    script = write_script(STATE_WORKER)
    port = str(_free_port())
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    procs = []
    for rank in range(2):
        env = {
            **base,
            "OMP_NUM_THREADS": "1",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "ACCEL_TIMEOUT": "120",
        }
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-4000:]
    _assert_real_two_process_group(_reports(tmp_path), "slurm")


def test_unreachable_group_is_an_error_not_a_single_process_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """WORLD_SIZE=2 with no rank 0 to join: the state fails loudly instead of running alone."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("ACCEL_TIMEOUT", "2")
    with pytest.raises(DistributedSetupError, match=r"rank 1 of 2 .*Check MASTER_ADDR/MASTER_PORT"):
        PartialState()
    assert not torch.distributed.is_initialized()
    assert not PartialState._shared_state.get("_initialized", False)


# ---- launcher variables ----------------------------------------------------------------------
def test_no_launcher_means_one_process() -> None:
    assert read_launch_env({}) == LaunchInfo()
    assert read_launch_env({}).distributed is False
    assert read_launch_env({"WORLD_SIZE": "1", "RANK": "0"}).distributed is False


def test_torchrun_variables() -> None:
    info = read_launch_env(
        {
            "WORLD_SIZE": "8",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "1234",
            "TORCHELASTIC_RESTART_COUNT": "2",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    )
    assert info == LaunchInfo(
        world_size=8,
        rank=5,
        local_rank=1,
        local_world_size=4,
        master_addr="10.0.0.1",
        master_port=1234,
        restart_count=2,
        use_agent_store=True,
        launcher="torchrun",
    )
    assert info.distributed


def test_slurm_variables() -> None:
    env = {
        "SLURM_NTASKS": "4",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS_PER_NODE": "2",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29600",
    }
    assert read_launch_env(env) == LaunchInfo(
        world_size=4, rank=3, local_rank=1, local_world_size=2, master_addr="node0", master_port=29600, launcher="slurm"
    )


def test_torchrun_variables_win_inside_a_slurm_allocation() -> None:
    env = {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    info = read_launch_env(env)
    assert (info.world_size, info.rank, info.local_rank, info.launcher) == (2, 1, 1, "torchrun")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            (4, 2, 0, 2),
        ),
        ({"PMI_SIZE": "3", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "3"}, (3, 1, 1, 3)),
        ({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_LOCAL_RANK": "1"}, (2, 1, 1, 2)),
    ],
    ids=["openmpi", "mpich-intel", "mvapich"],
)
def test_mpi_variables(env: dict[str, str], expected: tuple[int, int, int, int]) -> None:
    info = read_launch_env({**env, "MASTER_ADDR": "h", "MASTER_PORT": "4000"})
    assert (info.world_size, info.rank, info.local_rank, info.local_world_size) == expected
    assert (info.launcher, info.master_addr, info.master_port) == ("mpi", "h", 4000)
    assert info.distributed


# ---- shared state ------------------------------------------------------------------------------
def test_states_are_shared_between_instances() -> None:
    first = PartialState()
    second = PartialState()
    assert first is not second
    assert first.__dict__ is second.__dict__
    first.marker = "seen"
    assert second.marker == "seen"
    acc = Accelerator(mixed_precision="bf16")
    assert AcceleratorState().mixed_precision == "bf16"
    assert AcceleratorState().num_processes == 1  # forwarded to the partial state
    assert acc.state.adapter is PartialState().adapter
    GradientState().sync_gradients = False
    assert acc.gradient_state.sync_gradients is False


def test_changing_precision_of_a_live_state_is_refused_until_reset() -> None:
    Accelerator(mixed_precision="bf16")
    with pytest.raises(ValueError, match=r"already set up with mixed_precision='bf16'; cannot change it to 'fp16'"):
        Accelerator(mixed_precision="fp16")
    AcceleratorState._reset_state(reset_partial_state=True)
    assert Accelerator(mixed_precision="fp16").mixed_precision == "fp16"


def test_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mixed_precision must be one of 'no', 'bf16', 'fp16', 'fp8', got 'fp12'"):
        Accelerator(mixed_precision="fp12")


def test_precision_the_adapter_lacks_is_refused_with_its_list() -> None:
    with pytest.raises(
        ValueError, match=r"'cpu' adapter does not support mixed_precision='fp8'.*\['bf16', 'fp16', 'no'\]"
    ):
        Accelerator(mixed_precision="fp8")


def test_single_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    state = PartialState()
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.distributed_type == DistributedType.NO
    assert not state.use_distributed
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not torch.distributed.is_initialized()
    state.wait_for_everyone()  # a no-op, must not need a group
    assert "Num processes: 1" in repr(state)


def test_gradient_state_defaults_and_reset() -> None:
    gs = GradientState()
    assert gs.sync_gradients is True
    assert gs.num_steps == 1
    assert gs.end_of_dataloader is False
    assert gs.remainder == -1
    gs._set_sync_gradients(False)
    GradientState._reset_state()
    assert GradientState().sync_gradients is True
