"""save_state never destroys a user's files, checkpoints are verified, and a failed load changes nothing.

- In place: saving into a directory that holds the user's files (logs, configs, the training
  script) replaces only what accel wrote; a kill at any instant of replacing a checkpoint
  leaves the old or the new one loadable, and the user's files intact.
- Verified: a bit flip inside tensor data is caught by the SHA-256 recorded at save time.
- All or nothing: every damaged or mismatched file makes `load_state` raise before any live
  object changes.
- A failed save (disk full) removes its staging directory and keeps the previous checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import io as checkpoint_io
from accel.checkpoint import layout as checkpoint_layout
from accel.checkpoint.layout import REPLACED, STAGING
from accel.checkpoint.state import MANIFEST
from accel.errors import CheckpointError
from accel.state import AcceleratorState, GradientState
from conftest import launch
from safetensors.torch import load_file

USER_FILES = {"train.py": "print('my script')\n", "config.yaml": "lr: 0.1\n", "logs/run.txt": "step 1 loss 0.5\n"}


class Box:
    """A registered custom object."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = int(state["value"])


class Setup:
    """A fresh Accelerator with a model, optimizer, scheduler, loader and a registered object."""

    def __init__(self, seed: int = 0) -> None:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        torch.manual_seed(seed)
        self.accelerator = Accelerator()
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        opt = torch.optim.AdamW(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
        self.model, self.opt, self.sched, self.loader = self.accelerator.prepare(model, opt, sched, loader)
        self.box = Box()
        self.accelerator.register_for_checkpointing(self.box)

    def train(self, steps: int = 1) -> None:
        for _ in range(steps):
            (batch,) = next(iter(self.loader))
            self.accelerator.backward(self.model(batch).pow(2).mean())
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad()
            self.box.value += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "opt": {
                (pid, key): value.clone()
                for pid, state in self.opt.state_dict()["state"].items()
                for key, value in state.items()
            },
            "sched": dict(self.sched.state_dict()),
            "loader": self.loader.state_dict(),
            "box": self.box.value,
            "rng": torch.get_rng_state().clone(),
        }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["opt"].keys() == b["opt"].keys()
    for k in a["opt"]:
        assert torch.equal(a["opt"][k], b["opt"][k]), k
    # The loader's position; its saved generator states depend on the RNG a fresh setup drew.
    position = [{k: v for k, v in x["loader"].items() if k != "epoch_rng"} for x in (a, b)]
    assert a["sched"] == b["sched"] and position[0] == position[1] and a["box"] == b["box"]
    assert torch.equal(a["rng"], b["rng"])


def write_user_files(directory: Path) -> None:
    for name, text in USER_FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)


def assert_user_files(directory: Path) -> None:
    for name, text in USER_FILES.items():
        assert (directory / name).read_text() == text, name


def forge_hash(directory: Path, name: str) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["sha256"][name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    (directory / MANIFEST).write_text(json.dumps(manifest))


# ---- 1. the user's files are never touched ---------------------------------------------------
def test_save_into_a_directory_with_user_files_keeps_them(tmp_path: Path) -> None:
    target = tmp_path / "run"
    write_user_files(target)
    s = Setup()
    s.train()
    s.accelerator.save_state(target)
    s.train()
    expected = s.snapshot()
    s.accelerator.save_state(target)  # overwrite in place
    assert_user_files(target)
    assert not (target / STAGING).exists() and not (target / REPLACED).exists()
    fresh = Setup(seed=1)
    fresh.accelerator.load_state(target)
    expected["rng"] = fresh.snapshot()["rng"]
    assert_same(fresh.snapshot(), expected)


def test_save_into_the_working_directory_keeps_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_user_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    s = Setup()
    for _ in range(2):
        s.train()
        assert s.accelerator.save_state(".") == "."
    assert_user_files(tmp_path)
    assert (tmp_path / MANIFEST).is_file()


def test_save_onto_a_file_is_refused_and_keeps_it(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine")
    with pytest.raises(CheckpointError, match=r"save_state needs a directory, but .*notes\.txt is a file"):
        Setup().accelerator.save_state(target)
    assert target.read_text() == "mine"


def test_a_user_file_with_a_checkpoint_name_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "optimizer.bin").write_bytes(b"the user's own file")
    with pytest.raises(CheckpointError, match=r"would overwrite optimizer\.bin .* which accel did not write"):
        Setup().accelerator.save_state(tmp_path)
    assert (tmp_path / "optimizer.bin").read_bytes() == b"the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optimizer.bin"]


def test_pruning_removes_only_accel_files(tmp_path: Path) -> None:
    from accel import ProjectConfiguration

    s = Setup()
    s.accelerator.project_configuration = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1
    )
    first = Path(s.accelerator.save_state())
    (first / "notes.txt").write_text("kept")
    s.accelerator.save_state()
    assert sorted(p.name for p in first.iterdir()) == ["notes.txt"]


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, not even `except Exception` handlers."""


def _count_commit_steps(monkeypatch: pytest.MonkeyPatch, kill_at: int | None) -> list[int]:
    """Make the kill_at-th file-system step of a commit die; returns the step counter."""
    calls = [0]
    real_replace, real_rmtree = os.replace, checkpoint_layout.shutil.rmtree

    def step(real: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if kill_at is not None and calls[0] == kill_at:
                raise Killed
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(checkpoint_layout.os, "replace", step(real_replace))
    monkeypatch.setattr(checkpoint_layout.shutil, "rmtree", step(real_rmtree))
    return calls


def _old_and_new(target: Path) -> tuple[Setup, dict[str, Any], dict[str, Any]]:
    """A checkpoint at `target` ("old"), and a live state one step further ("new")."""
    write_user_files(target)
    s = Setup()
    s.train()
    s.accelerator.save_state(target)
    old = s.snapshot()
    s.train()
    return s, old, s.snapshot()


def test_a_kill_at_any_instant_of_a_replace_leaves_old_or_new(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, _, _ = _old_and_new(tmp_path / "count")
    with monkeypatch.context() as m:
        calls = _count_commit_steps(m, None)
        s.accelerator.save_state(tmp_path / "count")
    assert calls[0] >= 8, calls  # moves of the old files, the new files, both manifests, cleanups
    outcomes = []
    for kill_at in range(1, calls[0] + 1):
        target = tmp_path / f"run{kill_at}"
        s, old, new = _old_and_new(target)
        with monkeypatch.context() as m:
            _count_commit_steps(m, kill_at)
            with pytest.raises(Killed):
                s.accelerator.save_state(target)
        assert_user_files(target)
        fresh = Setup(seed=1)
        fresh.accelerator.load_state(target)
        got = fresh.snapshot()
        old["rng"] = new["rng"] = got["rng"]
        matches = [name for name, want in (("old", old), ("new", new)) if _same(got, want)]
        assert matches, f"killed at step {kill_at}: neither the old nor the new checkpoint loaded"
        outcomes.append(matches[0])
        # The next save finishes or discards the interrupted one and leaves no debris.
        fresh.accelerator.save_state(target)
        assert not (target / STAGING).exists() and not (target / REPLACED).exists()
        assert_user_files(target)
    # Early kills keep the old checkpoint; once the new one is sealed, it is the one that loads.
    assert outcomes[0] == "old" and outcomes[-1] == "new" and outcomes == sorted(outcomes, key=["old", "new"].index)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        assert_same(a, b)
    except AssertionError:
        return False
    return True


# ---- 3. verified checkpoints -----------------------------------------------------------------
def _flip_a_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 9] ^= 0x01  # inside the last tensor's data, past every header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.bin"])
def test_a_bit_flip_in_tensor_data_is_caught(tmp_path: Path, victim: str) -> None:
    s = Setup()
    s.train()
    directory = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    s.train()
    before = s.snapshot()
    _flip_a_data_byte(directory / victim)
    # The flipped file still parses: only the hash can tell.
    if victim == "model.safetensors":
        load_file(str(directory / victim))
    else:
        torch.load(directory / victim, weights_only=True)
    with pytest.raises(CheckpointError, match=rf"{victim} does not match the XXH3-128 hash recorded"):
        s.accelerator.load_state(directory)
    before["rng"] = s.snapshot()["rng"]
    assert_same(s.snapshot(), before)


def test_checkpoints_without_hashes_still_load(tmp_path: Path) -> None:
    s = Setup()
    s.train()
    directory = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    expected = s.snapshot()
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["sha256"], manifest["strategy_files"]
    manifest["format"] = 1
    (directory / MANIFEST).write_text(json.dumps(manifest))
    fresh = Setup(seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh.accelerator.load_state(directory)
    expected["rng"] = fresh.snapshot()["rng"]
    assert_same(fresh.snapshot(), expected)
    # One warning for the whole load, not one per file.
    unverified = [str(w.message) for w in caught if "unverified" in str(w.message)]
    assert len(unverified) == 1, unverified
    assert "was written by an accel release that recorded no hashes" in unverified[0]


def test_a_manifest_that_lost_hashes_loads_with_one_warning_naming_the_files(tmp_path: Path) -> None:
    s = Setup()
    s.train()
    directory = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fully hashed checkpoint loads without any warning
        s.accelerator.load_state(directory)
    manifest = json.loads((directory / MANIFEST).read_text())
    del manifest["sha256"]["model.safetensors"], manifest["sha256"]["optimizer.bin"]
    (directory / MANIFEST).write_text(json.dumps(manifest))
    _flip_a_data_byte(directory / "model.safetensors")  # no longer caught: that is what the warning says
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.accelerator.load_state(directory)
    unverified = [str(w.message) for w in caught if "unverified" in str(w.message)]
    assert len(unverified) == 1, unverified
    assert "its manifest records none for model.safetensors, optimizer.bin" in unverified[0], unverified


# ---- 4 and 5. all or nothing; every damaged file named -------------------------------------------
def _wrong_shape_model(directory: Path) -> None:
    from safetensors.torch import save_file

    sd = load_file(str(directory / "model.safetensors"))
    sd["2.weight"] = torch.zeros(5, 8)
    save_file(sd, str(directory / "model.safetensors"))
    forge_hash(directory, "model.safetensors")


def _missing_key_model(directory: Path) -> None:
    from safetensors.torch import save_file

    sd = load_file(str(directory / "model.safetensors"))
    del sd["2.bias"]
    save_file(sd, str(directory / "model.safetensors"))
    forge_hash(directory, "model.safetensors")


def _wrong_shape_optimizer(directory: Path) -> None:
    state = torch.load(directory / "optimizer.bin", weights_only=True)
    state["state"][0]["exp_avg"] = torch.zeros(3, 3)
    torch.save(state, directory / "optimizer.bin")
    forge_hash(directory, "optimizer.bin")


def _other_rng_form(directory: Path) -> None:
    state = torch.load(directory / "random_states_0.pt", weights_only=True)
    state["torch"] = state["torch"][:100]
    torch.save(state, directory / "random_states_0.pt")
    forge_hash(directory, "random_states_0.pt")


def _edit_manifest(**entries: Any) -> Any:
    def damage(directory: Path) -> None:
        manifest = json.loads((directory / MANIFEST).read_text())
        (directory / MANIFEST).write_text(json.dumps({**manifest, **entries}))

    return damage


def _rewrite(name: str, data: bytes, forge: bool = True) -> Any:
    def damage(directory: Path) -> None:
        (directory / name).write_bytes(data)
        if forge:
            forge_hash(directory, name)

    return damage


def _truncate(name: str) -> Any:
    def damage(directory: Path) -> None:
        data = (directory / name).read_bytes()
        (directory / name).write_bytes(data[: len(data) // 2])

    return damage


def _delete(name: str) -> Any:
    return lambda directory: (directory / name).unlink()


DAMAGE = {
    "optimizer truncated": (_truncate("optimizer.bin"), r"optimizer\.bin"),
    "optimizer missing": (_delete("optimizer.bin"), r"optimizer\.bin is missing"),
    "optimizer state of the wrong shape": (_wrong_shape_optimizer, r"optimizer\.bin does not fit the optimizer"),
    "model tensor of the wrong shape": (_wrong_shape_model, r"model\.safetensors does not fit the model"),
    "model key missing": (_missing_key_model, r"model\.safetensors does not fit the model: missing keys 2\.bias"),
    "scheduler garbage": (_rewrite("scheduler.bin", b"\x00garbage" * 9), r"scheduler\.bin"),
    "scheduler not a dict": (
        lambda d: (torch.save([1, 2], d / "scheduler.bin"), forge_hash(d, "scheduler.bin")),
        r"scheduler\.bin does not hold a scheduler state",
    ),
    "dataloaders truncated": (_rewrite("dataloaders.json", b'[{"epoch": 1, "batc'), r"dataloaders\.json is corrupted"),
    "dataloaders truncated, hash kept": (_truncate("dataloaders.json"), r"dataloaders\.json"),
    "dataloaders not a list": (_rewrite("dataloaders.json", b'{"epoch": 1}'), r"dataloaders\.json does not hold"),
    "dataloaders invalid utf-8": (
        _rewrite("dataloaders.json", b'[{"epoch": "\xff\xfe"}]'),
        r"dataloaders\.json is corrupted",
    ),
    "dataloaders wrong fields": (
        _rewrite("dataloaders.json", b'[{"nothing": 1}]'),
        r"dataloaders\.json does not hold a position for data loader 0: epoch, batches_yielded missing",
    ),
    "dataloaders negative position": (
        _rewrite("dataloaders.json", b'[{"epoch": 1, "batches_yielded": -2}]'),
        r"dataloaders\.json does not hold a position for data loader 0: batches_yielded",
    ),
    "dataloaders bad generator state": (
        _rewrite("dataloaders.json", b'[{"epoch": 1, "batches_yielded": 2, "epoch_rng": {"sampler": "@@"}}]'),
        r"dataloaders\.json does not hold a position for data loader 0: epoch_rng",
    ),
    "custom object missing": (_delete("custom_checkpoint_0.bin"), r"custom_checkpoint_0\.bin is missing"),
    "custom object garbage": (_rewrite("custom_checkpoint_0.bin", b"PK\x03\x04 nope"), r"custom_checkpoint_0\.bin"),
    "rng garbage": (_rewrite("random_states_0.pt", b"\x80\x02garbage"), r"random_states_0\.pt"),
    # Well-formed torch files holding something else: found while checking, before the models change.
    "rng wrong keys": (
        lambda d: (torch.save({"random_state": 1}, d / "random_states_0.pt"), forge_hash(d, "random_states_0.pt")),
        r"random_states_0\.pt does not hold random states: numpy, python, torch missing",
    ),
    "rng of another form": (_other_rng_form, r"random_states_0\.pt holds a 'torch' random state of another form"),
    "registered object refuses its state": (
        lambda d: (torch.save({"other": 1}, d / "custom_checkpoint_0.bin"), forge_hash(d, "custom_checkpoint_0.bin")),
        r"custom_checkpoint_0\.bin could not be loaded into the registered object \(KeyError: 'value'\)",
    ),
    "manifest invalid utf-8": (_rewrite(MANIFEST, b'{"format": "\xff\xfe"}', forge=False), rf"{MANIFEST} is corrupted"),
    "manifest truncated": (_rewrite(MANIFEST, b'{"format": 2, "fi', forge=False), rf"{MANIFEST} is corrupted"),
    "manifest not an object": (_rewrite(MANIFEST, b"[1, 2]", forge=False), rf"{MANIFEST} is corrupted"),
    "manifest hashes not a dict": (
        _edit_manifest(sha256=[["model.safetensors", "00"]]),
        rf"{MANIFEST} is corrupted: its 'sha256' entry must map file names to SHA-256 hex digests, got list",
    ),
    "manifest hash not text": (
        _edit_manifest(sha256={"model.safetensors": 5}),
        rf"{MANIFEST} is corrupted: its 'sha256' entry .* got 'model.safetensors': '5'",
    ),
    "manifest files not a list": (_edit_manifest(files="model.safetensors"), rf"{MANIFEST} is corrupted: its 'files'"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_failed_load_changes_nothing(tmp_path: Path, case: str) -> None:
    damage, message = DAMAGE[case]
    s = Setup()
    s.train(2)
    directory = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    s.train(2)  # the live objects now differ from the checkpoint in every part
    before = s.snapshot()
    damage(directory)
    with pytest.raises(CheckpointError, match=message):
        s.accelerator.load_state(directory)
    assert_same(s.snapshot(), before)


# ---- 10. a failed save leaves nothing behind -------------------------------------------------------
def test_disk_full_mid_save_keeps_the_previous_checkpoint_and_removes_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "run"
    s, saved, _ = _old_and_new(target)
    real_save = torch.save

    def full_disk(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        real_save(obj, f, *args, **kwargs)
        if isinstance(obj, dict) and "param_groups" in obj:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_io.torch, "save", full_disk)
    with pytest.raises(CheckpointError, match=r"save_state\(.*run\) failed: OSError: .*No space left on device"):
        s.accelerator.save_state(target)
    monkeypatch.undo()
    assert not (target / STAGING).exists()
    assert not list(target.rglob("*.tmp"))
    assert_user_files(target)
    fresh = Setup(seed=1)
    fresh.accelerator.load_state(target)
    saved["rng"] = fresh.snapshot()["rng"]
    assert_same(fresh.snapshot(), saved)


FAIL_ON_RANK_1 = """
import sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.errors import CheckpointError

target = Path(sys.argv[1])
accelerator = Accelerator()
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
accelerator.save_state(target)
if accelerator.process_index == 1:
    def broken():
        raise OSError(28, "No space left on device")
    accelerator.state.adapter.get_rng_state = broken
try:
    accelerator.save_state(target)
except CheckpointError as exc:
    print(f"rank {accelerator.process_index}: {exc}", flush=True)
accelerator.wait_for_everyone()
if accelerator.process_index == 1:
    del accelerator.state.adapter.get_rng_state
accelerator.load_state(target)
print(f"rank {accelerator.process_index}: loaded", flush=True)
"""


def test_a_save_failing_on_one_rank_fails_on_all_without_a_hang(write_script, tmp_path: Path) -> None:
    script = write_script(FAIL_ON_RANK_1)
    proc = launch(script, str(tmp_path / "ckpt"), timeout=120)
    for rank in (0, 1):
        assert f"rank {rank}: save_state(" in proc.stdout, proc.stdout
        assert f"rank {rank}: loaded" in proc.stdout, proc.stdout
    assert "failed on rank 1: OSError: [Errno 28] No space left on device" in proc.stdout, proc.stdout
    assert not (tmp_path / "ckpt" / STAGING).exists()


UNWRITABLE = """
import sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.errors import CheckpointError

blocker = Path(sys.argv[1])
accelerator = Accelerator()
model = torch.nn.Linear(2, 1)
model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
try:
    accelerator.save_state(blocker / "ckpt")  # a directory under a regular file cannot be created
except CheckpointError as exc:
    print(f"rank {accelerator.process_index}: {exc}", flush=True)
"""


def test_an_unwritable_target_fails_on_every_rank_with_the_cause(write_script, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file")
    proc = launch(write_script(UNWRITABLE), str(blocker), timeout=120)
    assert "rank 0: save_state(" in proc.stdout and "NotADirectoryError" in proc.stdout, proc.stdout
    assert "rank 1: save_state(" in proc.stdout and "failed on rank 0: NotADirectoryError" in proc.stdout
    assert blocker.read_text() == "a file"
