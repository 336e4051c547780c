"""Saving where Accelerate saved: its checkpoint files are replaced with a warning, nothing else is touched.

The Accelerate checkpoint here is written the way `accelerate==1.15.0`'s `save_state` writes
one (recorded from it: `model.safetensors` through safetensors, `optimizer.bin`,
`scheduler.bin`, `random_states_0.pkl` and `custom_checkpoint_0.pkl` through `torch.save`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from accel.checkpoint.layout import REPLACED, STAGING
from accel.checkpoint.state import MANIFEST
from accel.errors import CheckpointError
from safetensors.torch import save_file
from test_checkpoint_reliability import (
    Killed,
    Setup,
    _count_commit_steps,
    _same,
    assert_same,
    assert_user_files,
    write_user_files,
)

REPLACED_NAMES = ["model.safetensors", "optimizer.bin", "scheduler.bin"]
ACCELERATE_ONLY = ["custom_checkpoint_0.pkl", "random_states_0.pkl"]


def write_accelerate_checkpoint(directory: Path) -> dict[str, bytes]:
    """Accelerate's files for the model, optimizer and scheduler of `Setup`; returns every file's bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    torch.save(opt.state_dict(), directory / "optimizer.bin")
    torch.save({"step_size": 1, "gamma": 0.5, "last_epoch": 3}, directory / "scheduler.bin")
    torch.save({"random_state": [1, 2], "torch_manual_seed": torch.get_rng_state()}, directory / "random_states_0.pkl")
    torch.save({"value": 7}, directory / "custom_checkpoint_0.pkl")
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def _save(setup: Setup, target: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setup.accelerator.save_state(target)
    return [str(w.message) for w in caught if "save_state is replacing" in str(w.message)]


def test_saving_over_an_accelerate_checkpoint_replaces_its_files_once_with_a_warning(tmp_path: Path) -> None:
    target = tmp_path / "run"
    accelerate_files = write_accelerate_checkpoint(target)
    write_user_files(target)
    s = Setup()
    s.train(2)
    expected = s.snapshot()
    messages = _save(s, target)
    assert len(messages) == 1, messages
    assert f"save_state is replacing {', '.join(REPLACED_NAMES)} in {target}" in messages[0]
    assert f"not part of the new checkpoint: {', '.join(ACCELERATE_ONLY)}" in messages[0]
    # Accelerate's other files and the user's are kept byte for byte; the replaced ones are accel's now.
    assert_user_files(target)
    for name in ACCELERATE_ONLY:
        assert (target / name).read_bytes() == accelerate_files[name], name
    for name in REPLACED_NAMES:
        assert (target / name).read_bytes() != accelerate_files[name], name
    assert (target / MANIFEST).is_file() and not (target / STAGING).exists() and not (target / REPLACED).exists()
    fresh = Setup(seed=1)
    fresh.accelerator.load_state(target)
    expected["rng"] = fresh.snapshot()["rng"]
    assert_same(fresh.snapshot(), expected)
    # From now on the manifest lists them: the next save replaces them silently.
    s.train()
    assert _save(s, target) == []


def test_a_file_named_like_a_checkpoint_file_that_is_not_one_is_still_refused(tmp_path: Path) -> None:
    accelerate_files = write_accelerate_checkpoint(tmp_path)
    (tmp_path / "scheduler.bin").write_bytes(b"my notes, not a checkpoint")
    with pytest.raises(CheckpointError, match=r"would overwrite scheduler\.bin in .* they do not hold a checkpoint"):
        Setup().accelerator.save_state(tmp_path)
    # Nothing changed, the real checkpoint files included.
    assert (tmp_path / "scheduler.bin").read_bytes() == b"my notes, not a checkpoint"
    for name in ["model.safetensors", "optimizer.bin", *ACCELERATE_ONLY]:
        assert (tmp_path / name).read_bytes() == accelerate_files[name], name
    assert not (tmp_path / MANIFEST).exists() and not (tmp_path / STAGING).exists()


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.bin"])
def test_truncated_or_foreign_content_is_not_taken_for_a_checkpoint(tmp_path: Path, victim: str) -> None:
    write_accelerate_checkpoint(tmp_path)
    data = (tmp_path / victim).read_bytes()
    (tmp_path / victim).write_bytes(data[:6])  # a zip or safetensors header cut short
    with pytest.raises(CheckpointError, match=rf"would overwrite {victim.replace('.', '[.]')} in"):
        Setup().accelerator.save_state(tmp_path)
    assert (tmp_path / victim).read_bytes() == data[:6]


def test_a_kill_while_replacing_an_accelerate_checkpoint_leaves_it_or_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Setup()
    s.train()
    new = s.snapshot()
    write_accelerate_checkpoint(tmp_path / "count")
    with monkeypatch.context() as m:
        calls = _count_commit_steps(m, None)
        _save(s, tmp_path / "count")
    assert calls[0] >= 6, calls
    outcomes: list[str] = []
    for kill_at in range(1, calls[0] + 1):
        target = tmp_path / f"run{kill_at}"
        accelerate_files = write_accelerate_checkpoint(target)
        write_user_files(target)
        with monkeypatch.context() as m:
            _count_commit_steps(m, kill_at)
            with pytest.raises(Killed):
                _save(s, target)
        assert_user_files(target)
        fresh = Setup(seed=1)
        try:
            fresh.accelerator.load_state(target)
        except CheckpointError:
            # No accel checkpoint yet: then Accelerate's is exactly as it was.
            assert {n: (target / n).read_bytes() for n in accelerate_files} == accelerate_files
            outcomes.append("old")
            continue
        got: dict[str, Any] = fresh.snapshot()
        new["rng"] = got["rng"]
        assert _same(got, new), f"killed at step {kill_at}: a checkpoint loaded that is not the new one"
        outcomes.append("new")
    assert outcomes[0] == "old" and outcomes[-1] == "new", outcomes
    assert outcomes == sorted(outcomes, key=["old", "new"].index), outcomes
