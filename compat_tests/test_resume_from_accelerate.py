"""A checkpoint written by Accelerate 1.15.0's `save_state` resumes under accel with Accelerate's own numbers.

`scripts/resume_from_accelerate.py` trains 5 steps under the real Accelerate and saves; then the same
script resumes from that directory once under the real Accelerate and once under accel
(`accel.as_accelerate`), 6 more steps each. Every step draws from Python's, NumPy's and torch's
generators, so the losses, final weights, `accelerator.step`, the learning rate and a registered
object's state must all agree: within 1e-6 (they are bitwise equal). One process and DDP on 2
processes, weights as safetensors and as `pytorch_model.bin` (DDP with a shuffling stateful loader
saved mid-epoch: accel's loader goes on from `dl_state_dict.bin`'s batch, as Accelerate's does); FSDP2 on 2 processes with a full and
with a sharded state dict (`scripts/resume_fsdp_from_accelerate.py`). Without the translation of
Accelerate's random states the first resumed loss already differs (3.77 instead of 3.44).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, check, check_reference, torchrun

SCRIPT = str(SCRIPTS / "resume_from_accelerate.py")


@pytest.mark.parametrize(("nproc", "weights", "stateful"), [(2, "safe", "1"), (1, "bin", "0")])
def test_accel_resumes_an_accelerate_checkpoint_with_accelerates_numbers(
    real_accelerate: Path, tmp_path: Path, nproc: int, weights: str, stateful: str
) -> None:
    ckpt = tmp_path / "ckpt"
    saved = tmp_path / "saved.pt"
    env = {"ACCEL_TEST_STATEFUL": stateful}

    def run(*args: str, accel: bool) -> subprocess.CompletedProcess[str]:
        return torchrun(SCRIPT, *args, accel=accel, nproc=nproc, env=env)

    check_reference(run("save", str(ckpt), str(saved), weights, accel=False), saved)
    assert (ckpt / ("model.safetensors" if weights == "safe" else "pytorch_model.bin")).is_file()
    # Accelerate's stateful loader's position, 5 batches into the epoch (its look-ahead corrected).
    assert (ckpt / "dl_state_dict.bin").is_file() == (stateful == "1")
    assert sorted(p.name for p in ckpt.glob("random_states_*.pkl")) == [f"random_states_{r}.pkl" for r in range(nproc)]
    assert not (ckpt / "accel_checkpoint.json").exists()

    reference = tmp_path / "accelerate.pt"
    check_reference(run("resume", str(ckpt), str(reference), accel=False), reference)
    got = tmp_path / "accel.pt"
    proc = run("resume", str(ckpt), str(got), accel=True)
    check(proc)
    assert "was written by Accelerate, which records no hashes" in proc.stderr

    ref, mine = torch.load(reference), torch.load(got)
    assert len(ref["losses"]) == len(mine["losses"]) == 6
    assert mine["losses"] == pytest.approx(ref["losses"], abs=1e-6)
    assert (mine["step"], mine["count"]) == (ref["step"], ref["count"]) == (11, 11)
    assert mine["lr"] == pytest.approx(ref["lr"], abs=1e-12)
    assert set(mine["weights"]) == set(ref["weights"])
    for name, value in ref["weights"].items():
        torch.testing.assert_close(mine["weights"][name], value, atol=1e-6, rtol=0)
    # The resumed run did not start over: its first loss differs from the saving run's first.
    assert ref["losses"][0] != pytest.approx(torch.load(saved)["losses"][0], abs=1e-3)


@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_accel_resumes_an_fsdp2_checkpoint_in_accelerates_layout(
    real_accelerate: Path, tmp_path: Path, kind: str
) -> None:
    """FSDP2, 2 processes: `pytorch_model_fsdp.bin` + `optimizer.bin` (full) or the `pytorch_model_fsdp_0/` and
    `optimizer_0/` folders (sharded), written by Accelerate's own FSDP save functions (Accelerate runs FSDP only
    on accelerator devices, so the script calls the steps of `save_state`'s FSDP branch itself)."""
    script = str(SCRIPTS / "resume_fsdp_from_accelerate.py")
    ckpt = tmp_path / "ckpt"
    saved = tmp_path / "saved.pt"
    check_reference(torchrun(script, "save", str(ckpt), str(saved), kind, accel=False), saved)
    expected = {"full": {"pytorch_model_fsdp.bin", "optimizer.bin"}, "sharded": {"pytorch_model_fsdp_0", "optimizer_0"}}
    assert expected[kind] <= {p.name for p in ckpt.iterdir()}
    reference = tmp_path / "accelerate.pt"
    check_reference(torchrun(script, "resume", str(ckpt), str(reference), kind, accel=False), reference)
    got = tmp_path / "accel.pt"
    check(torchrun(script, "accel", str(ckpt), str(got), kind, accel=False))
    ref, mine = torch.load(reference), torch.load(got)
    assert len(ref["losses"]) == len(mine["losses"]) == 6
    assert mine["losses"] == pytest.approx(ref["losses"], abs=1e-6)
    for name, value in ref["weights"].items():
        torch.testing.assert_close(mine["weights"][name], value, atol=1e-6, rtol=0)


def test_a_pickled_accelerate_sampler_gives_its_seed_and_epoch(real_accelerate: Path, tmp_path: Path) -> None:
    """Accelerate 1.15 writes `sampler.bin` only for a SeedableRandomSampler under an IterableDatasetShard (a
    combination its own prepare never builds); an older or hand-made one pickles the real class, its
    dataset included. accel reads its seed and epoch with nothing in it unpickled."""
    from accel.checkpoint.accelerate_layout import loader_positions
    from accelerate.data_loader import SeedableRandomSampler
    from torch.utils.data import TensorDataset

    sampler = SeedableRandomSampler(TensorDataset(torch.arange(10.0)), data_seed=77)
    sampler.set_epoch(2)
    torch.save(sampler, tmp_path / "sampler_1.bin")
    assert loader_positions(tmp_path, [5, 6]) == [
        {"epoch": 5, "batches_yielded": 0, "seed": None},  # loader 0 has no file: it keeps its place
        {"epoch": 2, "batches_yielded": 0, "seed": 77},
    ]
