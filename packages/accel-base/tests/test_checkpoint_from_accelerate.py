"""`load_state` reads a directory in the layout Accelerate 1.15's `save_state` writes, and refuses what it cannot read.

The directories here are written file by file the way Accelerate's `save_accelerator_state` writes
them (`model.safetensors`, `optimizer.bin`, `scheduler.bin`, `custom_checkpoint_0.pkl`, and
`random_states_0.pkl`: a `torch.save` archive of the step and Python's, NumPy's and torch's
generator states, NumPy's as a tuple holding an array). Runs under the real Accelerate are in
compat_tests/test_resume_from_accelerate.py. A random-state file that references any other type
is refused naming the file and the type, and nothing in it runs; so are per-process FSDP files, by
name, and DeepSpeed's layout under any strategy but DeepSpeed. Loader positions (`dl_state_dict.bin`,
`sampler.bin`) become accel's; what holds more than a position is refused by name, and the pickled
sampler is read without anything in it running.
"""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from accel import Accelerator, DataLoaderConfiguration
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


def _loader_run(stateful: bool, seedable: bool = False) -> tuple[Accelerator, torch.utils.data.DataLoader]:
    torch.manual_seed(2)
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful, use_seedable_sampler=seedable)
    accelerator = Accelerator(dataloader_config=config)
    data = torch.utils.data.TensorDataset(torch.arange(24.0))
    return accelerator, accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))


def _stateful_state(yielded: int, **extra: object) -> dict[str, object]:
    """A `StatefulDataLoader.state_dict()` as torchdata 0.11 writes it for a map-style dataset, no workers."""
    return {
        "_index_sampler_state": None,
        "_sampler_iter_state": None,
        "_sampler_iter_yielded": yielded,
        "_num_yielded": yielded,
        "_IterableDataset_len_called": None,
        "_shared_seed": None,
        "fetcher_state": None,
        "dataset_state": None,
        "_iterator_finished": False,
        **extra,
    }


def _epoch_after_loading(directory: Path, stateful: bool) -> list[list[float]]:
    """The batches of an epoch after loading the checkpoint without a loader position (its random states
    restored, from which the shuffle is drawn)."""
    _write_accelerate_checkpoint(directory)
    accelerator, loader = _loader_run(stateful)
    accelerator.load_state(directory)
    return [batch[0].tolist() for batch in loader]


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
@pytest.mark.parametrize("stateful", [True, False])
def test_a_stateful_loader_position_goes_on_from_its_batch(tmp_path: Path, stateful: bool) -> None:
    """Accelerate's `dl_state_dict.bin` says 2 batches were yielded: a stateful accel loader skips them (in the
    order the restored random states draw, as Accelerate's does), one that is not starts the epoch over, as
    Accelerate's own loaders do."""
    epoch = _epoch_after_loading(tmp_path / "ckpt", stateful)
    torch.save(_stateful_state(2), tmp_path / "ckpt" / "dl_state_dict.bin")
    accelerator, loader = _loader_run(stateful)
    accelerator.load_state(tmp_path / "ckpt")
    assert [batch[0].tolist() for batch in loader] == (epoch[2:] if stateful else epoch)
    assert len(epoch) == 6


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
def test_a_finished_iterator_resumes_at_the_start_of_an_epoch(tmp_path: Path) -> None:
    epoch = _epoch_after_loading(tmp_path / "ckpt", True)
    torch.save(_stateful_state(6, _iterator_finished=True), tmp_path / "ckpt" / "dl_state_dict.bin")
    accelerator, loader = _loader_run(True)
    accelerator.load_state(tmp_path / "ckpt")
    assert [batch[0].tolist() for batch in loader] == epoch


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
@pytest.mark.parametrize(
    ("state", "message"),
    [
        (
            {"_snapshot": {"_snapshot_step": 4, "_main_snapshot": {}}, "_steps_since_snapshot": 1},
            r"saved with worker processes .*skip_first_batches\(loader, 5\)",
        ),
        (_stateful_state(2, _index_sampler_state={"samples_yielded": 8}), "holds _index_sampler_state"),
        (_stateful_state(2, dataset_state={"cursor": 3}), "holds dataset_state"),
        (_stateful_state(-1), "does not hold a StatefulDataLoader position"),
        ([1, 2], "does not hold a StatefulDataLoader state"),
    ],
)
def test_a_loader_state_beyond_a_position_is_refused_by_name(tmp_path: Path, state: object, message: str) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    torch.save(state, tmp_path / "ckpt" / "dl_state_dict.bin")
    accelerator, _ = _loader_run(True)
    model = accelerator.prepare(torch.nn.Linear(4, 3))
    before = model.weight.detach().clone()
    with pytest.raises(CheckpointError, match=rf"dl_state_dict\.bin .*{message}") as info:
        accelerator.load_state(tmp_path / "ckpt")
    assert "Nothing was loaded" in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(model.weight, before)


class _Sampler:
    """Pickled as `accelerate.data_loader.SeedableRandomSampler` (its state as Accelerate's holds it), with a
    dataset whose unpickling would call `open(marker, "w")`."""

    def __init__(self, marker: Path) -> None:
        self.data_source = Payload(marker)
        self.replacement = False
        self._num_samples = None
        self.generator = None
        self.initial_seed = 1234
        self.epoch = 3


@pytest.mark.filterwarnings("ignore:Checkpoint .* was written by Accelerate")
def test_a_pickled_seedable_sampler_gives_its_seed_and_epoch_and_nothing_in_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_accelerate_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "payload-ran"
    module = types.ModuleType("accelerate.data_loader")
    _Sampler.__module__, _Sampler.__qualname__ = "accelerate.data_loader", "SeedableRandomSampler"
    module.SeedableRandomSampler = _Sampler  # type: ignore[attr-defined]
    package = types.ModuleType("accelerate")
    package.data_loader = module  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:  # pickle finds the class by its name, as in Accelerate's own file
        patch.setitem(sys.modules, "accelerate", package)
        patch.setitem(sys.modules, "accelerate.data_loader", module)
        torch.save(_Sampler(marker), tmp_path / "ckpt" / "sampler.bin")
    accelerator, loader = _loader_run(False, seedable=True)
    accelerator.load_state(tmp_path / "ckpt")
    assert not marker.exists()
    sampler = loader.sampler if hasattr(loader.sampler, "seed") else loader.batch_sampler.sampler
    assert (sampler.seed, loader.epoch) == (1234, 3)

    torch.save({"initial_seed": 1, "epoch": 0}, tmp_path / "ckpt" / "sampler.bin")
    with pytest.raises(
        CheckpointError, match=r"sampler\.bin does not hold Accelerate's SeedableRandomSampler .*got dict"
    ):
        accelerator.load_state(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "sampler.bin").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"sampler\.bin could not be read as Accelerate's pickled sampler"):
        accelerator.load_state(tmp_path / "ckpt")
