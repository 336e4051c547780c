"""SLURM for real: `srun -N1 -n2` of an accel script, and `srun accel launch`, against `accel launch`.

Runs only where `nox -s slurm` started a one-node cluster (slurm_cluster.sh) and exported
its `SLURM_CONF`; elsewhere it skips saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scenarios" / "slurm_train.py"
pytestmark = pytest.mark.skipif(
    not os.environ.get("ACCEL_IT_SLURM") or shutil.which("srun") is None,
    reason="needs the one-node SLURM cluster of `nox -s slurm` (ACCEL_IT_SLURM and srun)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], out: Path) -> dict[int, dict[str, object]]:
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(_free_port())
    env.pop("ACCEL_ADAPTER", None)
    proc = subprocess.run([*cmd, str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{cmd}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-3000:]}"
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, object]]:
    out = tmp_path_factory.mktemp("ref") / "out"
    return _run([sys.executable, "-m", "accel.cli", "launch", "--cpu", "--num-processes", "2", str(SCRIPT)], out)


def _same_training(ranks: dict[int, dict[str, object]], reference: dict[int, dict[str, object]]) -> None:
    assert sorted(ranks) == [0, 1]
    for rank in (0, 1):
        got, want = ranks[rank], reference[rank]
        assert (got["world"], got["rank"], got["local_rank"]) == (2, rank, rank)
        assert got["gathered_ranks"] == [0, 1]
        assert got["weights"] == want["weights"] and got["bias"] == want["bias"], (got, want)


def test_srun_two_tasks_run_one_job(reference, tmp_path: Path) -> None:
    ranks = _run(["srun", "-N1", "-n2", sys.executable, str(SCRIPT)], tmp_path / "out")
    assert {r["launcher"] for r in ranks.values()} == {"slurm"}
    _same_training(ranks, reference)


def test_srun_accel_launch_per_node(reference, tmp_path: Path) -> None:
    cmd = ["srun", "-N1", "-n1", sys.executable, "-m", "accel.cli", "launch", "--cpu", "--num-processes", "2"]
    ranks = _run([*cmd, str(SCRIPT)], tmp_path / "out")
    assert {r["launcher"] for r in ranks.values()} == {"torchrun"}  # torchrun's variables win inside srun
    _same_training(ranks, reference)
