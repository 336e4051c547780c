"""An Accelerate example-style NLP script runs unchanged on accel with Accelerate's numbers.

`scripts/nlp_features.py` (a locally built tokenizer, a `datasets` dataset made in code, a tiny BERT,
an evaluate-style metric) uses memory (find_executable_batch_size), gradient accumulation, tracking,
early stopping, epoch checkpoints and local SGD in one run. Under the real Accelerate and under
`accel launch -m accel.as_accelerate` (Accelerate installed), on 2 CPU processes: every loss, every
metric and the final weights agree within 1e-5 (they are bitwise equal).
"""

from __future__ import annotations

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
