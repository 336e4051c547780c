"""An Accelerate example-style NLP script runs unchanged on accel with Accelerate's numbers.

`scripts/nlp_features.py` (a locally built tokenizer, a `datasets` dataset made in code, a tiny BERT,
an evaluate-style metric) uses memory (find_executable_batch_size), gradient accumulation, tracking,
early stopping, epoch checkpoints and local SGD in one run. Under the real Accelerate and under
`accel launch -m accel.as_accelerate` (Accelerate installed), on 2 CPU processes: every loss, every
metric and the final weights agree within 1e-5 (they are bitwise equal).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, check, check_reference, torchrun
from test_hf_trainer import accel_launch

pytest.importorskip("datasets")


def test_example_style_script_gives_accelerates_numbers(real_accelerate: Path, tmp_path: Path) -> None:
    script = str(SCRIPTS / "nlp_features.py")
    ref_dir, got_dir = tmp_path / "accelerate", tmp_path / "accel"
    check_reference(torchrun(script, str(ref_dir), accel=False), ref_dir / "result.pt")
    check(accel_launch(script, str(got_dir)))
    ref, got = torch.load(ref_dir / "result.pt"), torch.load(got_dir / "result.pt")
    assert got["batch_sizes"] == ref["batch_sizes"] == [4, 3], "the simulated out-of-memory retried smaller"
    assert got["metrics"] == ref["metrics"] and len(got["metrics"]) == 4
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5) and len(got["losses"]) == len(ref["losses"])
    assert set(got["weights"]) == set(ref["weights"])
    for name, value in ref["weights"].items():
        torch.testing.assert_close(got["weights"][name], value, atol=1e-5, rtol=0, msg=name)
    assert got["logged"], "the tensorboard tracker wrote its event file"
    for epoch in range(3):
        assert (got_dir / f"epoch_{epoch}" / "model.safetensors").is_file()


def test_example_style_workflows_give_accelerates_numbers(real_accelerate: Path, tmp_path: Path) -> None:
    """scripts/nlp_workflows.py: fp16 DDP comm hook, profiler, mid-epoch checkpoint and resume, multi-process
    metrics (the evened-out last batch's repeats dropped), 3-fold cross-validation and a schedule-free
    optimizer, under both libraries."""
    pytest.importorskip("schedulefree")
    script = str(SCRIPTS / "nlp_workflows.py")
    ref_dir, got_dir = tmp_path / "accelerate", tmp_path / "accel"
    check_reference(torchrun(script, str(ref_dir), accel=False), ref_dir / "result.pt")
    check(accel_launch(script, str(got_dir)))
    ref, got = torch.load(ref_dir / "result.pt"), torch.load(got_dir / "result.pt")
    assert len(got["losses"]) == len(ref["losses"]) == 18
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert set(got["weights"]) == set(ref["weights"])
    for name, value in ref["weights"].items():
        torch.testing.assert_close(got["weights"][name], value, atol=1e-5, rtol=0, msg=name)
    # Resumed from the mid-epoch checkpoint, accel repeats the uninterrupted run exactly. Accelerate does
    # not (its resumed losses differ from the first resumed step: the loader's iterator draws its base seed
    # from the restored RNG, and dropout's stream moves on): only its length is checked.
    assert got["resumed_losses"] == got["losses"][4:] and len(ref["resumed_losses"]) == 14
    for name, value in got["weights"].items():
        torch.testing.assert_close(got["resumed_weights"][name], value, atol=0, rtol=0, msg=name)
    for side in (ref, got):
        assert side["traces"] == ["profile_0.json", "profile_1.json"] and side["profiled"] == [
            "aten::addmm",
            "aten::mm",
        ]
        # 26 examples in batches of 4 on 2 processes: gather() returns the evened-out 32, gather_for_metrics 26.
        assert side["metric"]["count"] == len(side["objects"]) == 26 and side["gathered_with_padding"] == 32
        assert [f["count"] for f in side["fold_metrics"]] == [24, 24, 24] and side["cv_metric"]["count"] == 26
    assert got["metric"] == ref["metric"] and got["objects"] == ref["objects"]
    assert got["fold_metrics"] == ref["fold_metrics"] and got["cv_metric"] == ref["cv_metric"]
    torch.testing.assert_close(got["test_logits"], ref["test_logits"], atol=1e-5, rtol=0)
    assert len(got["sf_losses"]) == 9 and got["sf_losses"] == pytest.approx(ref["sf_losses"], abs=1e-5)
    assert got["sf_metric"] == ref["sf_metric"] and got["sf_metric"]["count"] == 26
    for name, value in ref["sf_weights"].items():
        torch.testing.assert_close(got["sf_weights"][name], value, atol=1e-5, rtol=0, msg=f"schedule-free: {name}")
    for rank in range(2):
        json.loads((got_dir / "trace" / f"profile_{rank}.json").read_text())
