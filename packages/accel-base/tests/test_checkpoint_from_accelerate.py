"""`load_state` reads a directory in the layout Accelerate 1.15's `save_state` writes, and refuses what it cannot read.

The directories here are written file by file the way Accelerate's `save_accelerator_state` writes
them (`model.safetensors`, `optimizer.bin`, `scheduler.bin`, `custom_checkpoint_0.pkl`, and
`random_states_0.pkl`: a `torch.save` archive of the step and Python's, NumPy's and torch's
generator states, NumPy's as a tuple holding an array). Runs under the real Accelerate are in
compat_tests/test_resume_from_accelerate.py. A random-state file that references any other type
is refused naming the file and the type, and nothing in it runs; so are per-process FSDP files and
pickled loader positions, by name, and DeepSpeed's layout under any strategy but DeepSpeed.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from accel import Accelerator
from accel.errors import CheckpointError, UnsafeCheckpointError
from safetensors.torch import save_file
from test_checkpoint_safety import Box, Payload


def _run(seed: int) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR, Box]:
    torch.manual_seed(seed)
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    box = Box(value=seed, weights=torch.full((2,), float(seed)))
    accelerator.register_for_checkpointing(box)
    return accelerator, model, opt, sched, box


def _write_accelerate_checkpoint(directory: Path) -> dict[str, object]:
    """Train one step and write what Accelerate's save_state writes; returns what a resume must restore."""
    _, model, opt, sched, box = _run(seed=1)
    model(torch.randn(5, 4)).pow(2).sum().backward()
    opt.step()
    sched.step()
    directory.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    torch.save(opt.state_dict(), directory / "optimizer.bin")
    torch.save(sched.state_dict(), directory / "scheduler.bin")
    torch.save(box.state_dict(), directory / "custom_checkpoint_0.pkl")
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)
    np.random.randn()  # NumPy's state then holds a cached Gaussian
    states = {
        "step": 4,
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    torch.save(states, directory / "random_states_0.pkl")
    draws = (random.random(), np.random.randn(), torch.rand(3))
    return {"model": model.state_dict(), "opt": opt.state_dict(), "lr": sched.get_last_lr(), "draws": draws}


def test_an_accelerate_checkpoint_loads_every_state(tmp_path: Path) -> None:
    saved = _write_accelerate_checkpoint(tmp_path / "ckpt")
    accelerator, model, opt, sched, box = _run(seed=2)
    with pytest.warns(UserWarning, match="was written by Accelerate, which records no hashes"):
        accelerator.load_state(tmp_path / "ckpt")
    for name, value in saved["model"].items():  # type: ignore[attr-defined]
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    loaded = opt.state_dict()
    for pid, state in saved["opt"]["state"].items():  # type: ignore[index]
        for key, value in state.items():
            torch.testing.assert_close(loaded["state"][pid][key], value, rtol=0, atol=0)
    assert sched.get_last_lr() == saved["lr"]
    assert box.state["value"] == 1 and torch.equal(box.state["weights"], torch.full((2,), 1.0))  # type: ignore[arg-type]
    assert accelerator.step == 4
    py, gauss, tensor = saved["draws"]  # type: ignore[misc]
    assert (random.random(), np.random.randn()) == (py, gauss)
    assert torch.equal(torch.rand(3), tensor)


def test_a_random_state_file_with_another_type_is_refused_and_never_runs(tmp_path: Path) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "payload-ran"
    torch.save({"step": 1, "random_state": Payload(marker)}, tmp_path / "ckpt" / "random_states_0.pkl")
    accelerator, model, *_ = _run(seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl references (io|builtins)\.open, a type") as info:
        accelerator.load_state(tmp_path / "ckpt")
    assert "\n" not in str(info.value) and "nothing in it ran" in str(info.value)
    assert not marker.exists()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
def test_a_registered_object_that_needs_code_is_refused(tmp_path: Path) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "payload-ran"
    torch.save({"value": Payload(marker)}, tmp_path / "ckpt" / "custom_checkpoint_0.pkl")
    accelerator, *_ = _run(seed=2)
    with pytest.raises(UnsafeCheckpointError, match=r"custom_checkpoint_0\.pkl.*Nothing in it was run"):
        accelerator.load_state(tmp_path / "ckpt")
    assert not marker.exists()


def test_a_damaged_random_state_file_is_named(tmp_path: Path) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "random_states_0.pkl").write_bytes(b"\x80\x04garbage")
    accelerator, *_ = _run(seed=2)
    with pytest.raises(CheckpointError, match=r"random_states_0\.pkl is not a torch\.save archive"):
        accelerator.load_state(tmp_path / "ckpt")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # DeepSpeed's engine checkpoint: read by accel's DeepSpeed strategy only (tests/deepspeed/).
        ("pytorch_model/mp_rank_00_model_states.pt", r"ckpt holds its models .*\(pytorch_model\).* cannot read"),
        ("pytorch_model_fsdp_0_rank0.bin", "one file per process"),
        ("dl_state_dict.bin", "position of a data loader"),
        ("sampler.bin", "position of a data loader"),
    ],
)
def test_layouts_accel_cannot_read_are_refused_by_name(tmp_path: Path, extra: str, message: str) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    target = tmp_path / "ckpt" / extra
    target.parent.mkdir(exist_ok=True)
    torch.save({}, target)
    accelerator, model, *_ = _run(seed=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=message) as info:
        accelerator.load_state(tmp_path / "ckpt")
    assert "Nothing was loaded" in str(info.value) and "Load an earlier checkpoint" not in str(info.value)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
def test_a_damaged_file_is_named_as_accelerate_wrote_it_and_no_scratch_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    accelerator, *_ = _run(seed=2)
    accelerator.load_state(tmp_path / "ckpt")
    gc.collect()
    assert list(scratch.iterdir()) == []  # the translation lives only as long as the load
    (tmp_path / "ckpt" / "optimizer.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=rf"Checkpoint file {tmp_path / 'ckpt' / 'optimizer.bin'} could not"):
        accelerator.load_state(tmp_path / "ckpt")
    gc.collect()
    assert list(scratch.iterdir()) == []


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
def test_a_process_without_saved_random_states_is_told(tmp_path: Path) -> None:
    saved = _write_accelerate_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "random_states_0.pkl").rename(tmp_path / "ckpt" / "random_states_1.pkl")
    accelerator, model, *_ = _run(seed=2)
    with pytest.warns(UserWarning, match=r"holds no random states for process 0 \(random_states_0\.pkl"):
        accelerator.load_state(tmp_path / "ckpt")
    assert accelerator.step == 4  # the step every process saved, read from another process's file
    torch.testing.assert_close(model.weight, saved["model"]["weight"], rtol=0, atol=0)  # type: ignore[index]
