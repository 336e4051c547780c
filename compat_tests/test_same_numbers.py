"""Same script, same seed, same defaults: accel reproduces Accelerate 1.15.0's training exactly.

`scripts/same_numbers.py` is an Accelerate script (shuffling, dropout, AdamW, warmup
LambdaLR, gradient accumulation, clipping, gather_for_metrics). It runs on 2 CPU processes
once under the real Accelerate and once unchanged under accel (`accel.as_accelerate`
resolves `import accelerate` to accel); the final weights must agree within 1e-5 (they
are in fact bitwise equal) and so must every logged loss. The same run with accel's other
shuffling mode (`use_seedable_sampler=True`) differs, so the comparison does see the order.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, check, check_reference, torchrun


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_accel_reproduces_accelerates_trajectory(real_accelerate: Path, tmp_path: Path, precision: str) -> None:
    script = str(SCRIPTS / "same_numbers.py")
    reference = tmp_path / "accelerate.pt"
    check_reference(torchrun(script, str(reference), precision, accel=False), reference)
    check(torchrun(script, str(tmp_path / "accel.pt"), precision, accel=True))
    ref = torch.load(tmp_path / "accelerate.pt")
    got = torch.load(tmp_path / "accel.pt")
    assert len(ref["losses"]) == len(got["losses"]) == 30
    assert got["losses"] == pytest.approx(ref["losses"], abs=1e-6)
    assert got["accuracies"] == ref["accuracies"]
    assert set(got["weights"]) == set(ref["weights"])
    for name, value in ref["weights"].items():
        torch.testing.assert_close(got["weights"][name], value, atol=1e-5, rtol=0)


def test_the_seedable_sampler_gives_other_numbers(real_accelerate: Path, tmp_path: Path) -> None:
    script = str(SCRIPTS / "same_numbers.py")
    check(torchrun(script, str(tmp_path / "default.pt"), "no", accel=True))
    check(torchrun(script, str(tmp_path / "seedable.pt"), "no", "seedable", accel=True))
    default, seedable = torch.load(tmp_path / "default.pt"), torch.load(tmp_path / "seedable.pt")
    assert default["losses"][0] != seedable["losses"][0]
    assert not torch.allclose(default["weights"]["0.weight"], seedable["weights"]["0.weight"], atol=1e-3)
