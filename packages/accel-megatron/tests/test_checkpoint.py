"""save_state / load_state through megatron-core's distributed checkpointing resume exactly
(losses, weights and the learning-rate schedule), under TP=2 and under PP=2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import WORKERS, run_launch

pytest.importorskip("megatron.core")


@pytest.mark.parametrize(
    ("tp", "pp", "dropout", "precision", "virtual"),
    [(2, 1, 0.0, "no", 0), (1, 2, 0.0, "no", 0), (2, 1, 0.3, "no", 0), (1, 2, 0.0, "bf16", 0), (1, 2, 0.0, "no", 2)],
)
def test_save_state_load_state_resumes_exactly(
    tmp_path: Path, tp: int, pp: int, dropout: float, precision: str, virtual: int
) -> None:
    """With dropout under TP=2, the model-parallel RNG tracker's streams are part of the checkpoint; under bf16
    the pipeline runs megatron-core's Float16Module stages and its mixed-precision optimizer; with 2 virtual
    stages every model chunk is its own entry of the distributed checkpoint."""
    run_launch(
        WORKERS / "resume.py",
        str(tp),
        str(pp),
        str(tmp_path),
        str(dropout),
        str(virtual),
        env={"ACCEL_MIXED_PRECISION": precision},
    )
    result = json.loads((tmp_path / "resume.json").read_text())
    assert result["dtype"] == ("torch.bfloat16" if precision == "bf16" else "torch.float32")
    assert result["first"] == result["again"]
    assert (tmp_path / "ckpt" / "megatron_models").is_dir(), "megatron-core's distributed checkpoint"
    assert (tmp_path / "ckpt" / "megatron.json").is_file()


def test_load_state_without_a_megatron_checkpoint_says_so(tmp_path: Path) -> None:
    from accel.errors import CheckpointError
    from accel_megatron.checkpoint import load

    with pytest.raises(CheckpointError, match="holds no megatron-core checkpoint"):
        load(object(), tmp_path, strict=True)
