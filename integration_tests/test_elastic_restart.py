"""Elastic restart: a rank killed with SIGKILL mid-training, torchrun restarts the group, the
script resumes from the last complete checkpoint and ends bitwise where an uninterrupted
run ends (shuffled data, dropout, AdamW, an LR schedule, 2 gloo processes).

Also covers the two traps of issue 3: the restarted gloo group must re-form (store keys
scoped to the restart round), and `save_state()` after `load_state()` must number on
instead of colliding with `checkpoint_0`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch
from accel.checkpoint.state import list_checkpoints
from safetensors.torch import load_file

KILL_AT_STEP = 7  # after the checkpoint of step 5, in the second epoch (6 batches per rank and epoch)


def _rounds(project: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (project / "rounds.jsonl").read_text().splitlines()]


def _differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float((a[k] - b[k]).abs().max()) for k in a if not torch.equal(a[k], b[k])}


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit code {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


def test_killed_rank_restarts_and_matches_uninterrupted_run(accel_launch, scenario: Path, tmp_path: Path) -> None:
    script = scenario / "elastic_train.py"
    reference, elastic = tmp_path / "reference", tmp_path / "elastic"
    reference.mkdir()
    elastic.mkdir()

    proc = accel_launch(script, str(reference))
    assert proc.returncode == 0, _output(proc)
    assert _rounds(reference) == [{"restart": 0, "resumed_from": None, "step": 0}]

    proc = accel_launch(
        script, str(elastic), "--kill-at-step", str(KILL_AT_STEP), launch_args=("--max-restarts", "1"), timeout=400
    )
    assert proc.returncode == 0, _output(proc)
    # Rank 1 really died by SIGKILL, and the group re-formed for a second round that
    # resumed from the step-5 checkpoint.
    assert "exitcode: -9) local_rank: 1" in proc.stderr, _output(proc)
    assert _rounds(elastic) == [
        {"restart": 0, "resumed_from": None, "step": 0},
        {"restart": 1, "resumed_from": 0, "step": 5},
    ]
    assert "finished at step 12" in proc.stdout
    # Numbering went on after the loaded checkpoint (step 10 is checkpoint_1), as uninterrupted.
    assert [p.name for _, p in list_checkpoints(elastic)] == ["checkpoint_0", "checkpoint_1"]
    assert [p.name for _, p in list_checkpoints(reference)] == ["checkpoint_0", "checkpoint_1"]

    expected = load_file(reference / "final" / "model.safetensors")
    got = load_file(elastic / "final" / "model.safetensors")
    assert expected.keys() == got.keys()
    assert not _differences(expected, got), f"max abs difference per tensor: {_differences(expected, got)}"
    assert (elastic / "final" / "model.safetensors").read_bytes() == (
        reference / "final" / "model.safetensors"
    ).read_bytes()
    # The comparison is not vacuous: training moved the weights after the resumed checkpoint.
    resumed = load_file(elastic / "checkpoints" / "checkpoint_0" / "model.safetensors")
    assert _differences(resumed, got)
