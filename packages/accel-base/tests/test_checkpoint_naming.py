"""Automatic checkpoint naming: numbering, pruning, picking the latest, numbering on after a load.

The trap (issue 3, trap 2): after `load_state()` in a fresh process, `save_state()` must
write the checkpoint after the loaded one, not collide with `checkpoint_0`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from accel import Accelerator, ProjectConfiguration
from accel.checkpoint.layout import MARKER, STAGING
from accel.checkpoint.state import MANIFEST, TMP_SUFFIX, list_checkpoints
from accel.errors import CheckpointError
from accel.state import AcceleratorState, GradientState
from conftest import launch


def _setup(project: Path, **config: object) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, **config)
    )
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    return accelerator, model, opt


def _step(accelerator: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    accelerator.backward(model(torch.ones(2, 3)).sum())
    opt.step()
    opt.zero_grad()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _names(project: Path) -> list[str]:
    return [p.name for _, p in list_checkpoints(project)]


def test_numbering_and_total_limit(tmp_path: Path) -> None:
    accelerator, model, opt = _setup(tmp_path, total_limit=2)
    saved = []
    for n in range(5):
        _step(accelerator, model, opt)
        saved.append(_weights(model))
        assert accelerator.save_state() == str(tmp_path / "checkpoints" / f"checkpoint_{n}")
        assert _names(tmp_path) == [f"checkpoint_{i}" for i in range(max(0, n - 1), n + 1)]
    assert accelerator.save_iteration == 5
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_3", "checkpoint_4"]

    # A fresh process: load_state() takes the newest, and the weights are those saved then.
    torch.manual_seed(1)
    accelerator, model, opt = _setup(tmp_path, total_limit=2)
    accelerator.load_state()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[4][name]), name


def test_save_after_load_continues_numbering(tmp_path: Path) -> None:
    accelerator, model, opt = _setup(tmp_path)
    for _ in range(3):
        _step(accelerator, model, opt)
        accelerator.save_state()
    accelerator, model, opt = _setup(tmp_path)
    assert accelerator.save_iteration == 0
    accelerator.load_state()
    assert accelerator.save_iteration == 3
    assert accelerator.save_state() == str(tmp_path / "checkpoints" / "checkpoint_3")
    assert _names(tmp_path) == ["checkpoint_0", "checkpoint_1", "checkpoint_2", "checkpoint_3"]


def test_load_explicit_older_then_save_refuses_to_overwrite(tmp_path: Path) -> None:
    accelerator, *_ = _setup(tmp_path)
    for _ in range(3):
        accelerator.save_state()
    accelerator, *_ = _setup(tmp_path)
    accelerator.load_state(tmp_path / "checkpoints" / "checkpoint_0")
    assert accelerator.save_iteration == 1
    with pytest.raises(ValueError, match=r"checkpoint_1 \(1\) already exists.*save_iteration"):
        accelerator.save_state()


def test_latest_is_numeric_and_complete(tmp_path: Path) -> None:
    accelerator, model, opt = _setup(tmp_path, iteration=9)
    _step(accelerator, model, opt)
    accelerator.save_state()  # checkpoint_9
    _step(accelerator, model, opt)
    expected = _weights(model)
    accelerator.save_state()  # checkpoint_10: newer, though "checkpoint_9" sorts after it as text
    root = tmp_path / "checkpoints"
    # Debris of crashed saves: a half-written staging directory (what a kill leaves now) and a
    # temporary sibling (what releases before in-place saves left).
    (root / "checkpoint_11" / STAGING).mkdir(parents=True)
    (root / "checkpoint_11" / STAGING / MARKER).write_text("made by accel")
    (root / "checkpoint_11" / STAGING / "model.safetensors").write_bytes(b"half")
    (root / f"checkpoint_12{TMP_SUFFIX}").mkdir()
    assert _names(tmp_path) == ["checkpoint_9", "checkpoint_10"]

    accelerator, model, opt = _setup(tmp_path)
    accelerator.load_state()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert accelerator.save_iteration == 11
    # The incomplete checkpoint_11 is not mistaken for a finished one: it is replaced.
    assert accelerator.save_state() == str(root / "checkpoint_11")
    assert (root / "checkpoint_11" / MANIFEST).is_file()
    assert sorted(p.name for p in (root / "checkpoint_11").iterdir()) == sorted(
        [MANIFEST, "model.safetensors", "optimizer.bin", "dataloaders.json", "random_states_0.pt"]
    )


def test_load_without_any_checkpoint(tmp_path: Path) -> None:
    accelerator, *_ = _setup(tmp_path)
    with pytest.raises(CheckpointError, match=r"No complete checkpoint under .*checkpoints"):
        accelerator.load_state()


def test_naming_needs_project_dir() -> None:
    accelerator = Accelerator(project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
    with pytest.raises(ValueError, match="automatic_checkpoint_naming needs `project_dir`"):
        accelerator.save_state()


def test_load_needs_dir_without_naming() -> None:
    accelerator = Accelerator()
    with pytest.raises(ValueError, match="load_state needs `input_dir`"):
        accelerator.load_state()


FRESH_GROUP_SCRIPT = """
import sys
import torch
from accel import Accelerator, ProjectConfiguration

project, phase = sys.argv[1], sys.argv[2]
accelerator = Accelerator(project_config=ProjectConfiguration(
    project_dir=project, automatic_checkpoint_naming=True, total_limit=2))
torch.manual_seed(0)
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
if phase == "resume":
    accelerator.load_state()
    if accelerator.is_main_process:
        torch.save(model.module.state_dict(), f"{project}/loaded.pt")
for _ in range(3 if phase == "first" else 1):
    x = torch.full((2, 3), float(accelerator.process_index + 1))
    accelerator.backward(model(x).sum())
    opt.step()
    opt.zero_grad()
    path = accelerator.save_state()  # on every rank; printed once, so two ranks' output cannot interleave
    accelerator.print(f"saved {path}", flush=True)
if accelerator.is_main_process and phase == "first":
    torch.save(model.module.state_dict(), f"{project}/last.pt")
"""


def test_fresh_process_group_numbers_on(write_script, tmp_path: Path) -> None:
    script = write_script(FRESH_GROUP_SCRIPT)
    launch(script, str(tmp_path), "first", timeout=180)
    assert _names(tmp_path) == ["checkpoint_1", "checkpoint_2"]
    proc = launch(script, str(tmp_path), "resume", timeout=180)
    assert f"saved {tmp_path / 'checkpoints' / 'checkpoint_3'}" in proc.stdout
    assert _names(tmp_path) == ["checkpoint_2", "checkpoint_3"]
    last = torch.load(tmp_path / "last.pt", weights_only=True)
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert last.keys() == loaded.keys()
    for name in last:
        assert torch.equal(last[name], loaded[name]), name
