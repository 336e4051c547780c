"""`LocalSGD` gives Accelerate 1.15.0's numbers: the same script (`scripts/local_sgd.py`, 2 CPU processes,
different data per rank, AdamW, averaging every 3 steps and at the end) under the real Accelerate and
unchanged under accel: the weights after every step are equal, and the replicas agree at the end.
"""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import SCRIPTS, check, check_reference, torchrun


def test_local_sgd_matches_accelerate(real_accelerate: Path, tmp_path: Path) -> None:
    script = str(SCRIPTS / "local_sgd.py")
    reference, ours = tmp_path / "accelerate.pt", tmp_path / "accel.pt"
    check_reference(torchrun(script, str(reference), accel=False), reference)
    check(torchrun(script, str(ours), accel=True))
    ref, got = torch.load(reference), torch.load(ours)
    assert ref["ranks_agree"] and got["ranks_agree"]
    assert len(got["history"]) == len(ref["history"]) == 7
    for step, (want, have) in enumerate(zip(ref["history"], got["history"]), 1):
        for a, b in zip(want, have):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=f"step {step}")
    # Not vacuous: training moved the weights between the first step and the last.
    assert not torch.allclose(ref["history"][0][0], ref["final"][0])
