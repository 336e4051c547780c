"""Checkpoints are safe to load and fail clearly when damaged; a crash mid-save loses nothing.

Safety: a file crafted to run code when unpickled (a `__reduce__` payload) is refused,
and the payload provably does not run. Damage: truncated or garbage files raise a
`CheckpointError` naming the file. Atomicity: one rank is killed with SIGKILL in the
middle of `save_state`, after some files of the new checkpoint are already on disk; the
previous checkpoint must still load and hold exactly what was saved.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch
from accel import Accelerator, ProjectConfiguration
from accel.checkpoint.layout import STAGING
from accel.checkpoint.state import MANIFEST, list_checkpoints
from accel.errors import CheckpointError, UnsafeCheckpointError
from conftest import launch


class Box:
    """A custom object registered for checkpointing: holds any plain state."""

    def __init__(self, **state: object) -> None:
        self.state = state

    def state_dict(self) -> dict[str, object]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.state = dict(state)


class Payload:
    """Unpickling this calls `open(marker, "w")`: a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (str(self.marker), "w"))


def _forge_hash(directory: Path, name: str) -> None:
    """Record `name`'s current hash in the manifest: an attacker who rewrites a file can rewrite that too."""
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["sha256"][name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _trained(seed: int = 0) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, Box]:
    torch.manual_seed(seed)
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.randn(5, 4)).pow(2).sum())
    opt.step()
    box = Box(value=7)
    accelerator.register_for_checkpointing(box)
    return accelerator, model, opt, box


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Accelerator, Path]:
    accelerator, *_ = _trained()
    return accelerator, Path(accelerator.save_state(tmp_path / "ckpt"))


# ---- unsafe pickles -----------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["optimizer.bin", "custom_checkpoint_0.bin", "random_states_0.pt"])
def test_pickle_payload_is_refused_and_never_runs(checkpoint: tuple[Accelerator, Path], tmp_path: Path, victim: str):
    accelerator, directory = checkpoint
    marker = tmp_path / "payload-ran"
    torch.save({"state": Payload(marker)}, directory / victim)
    # The crafted file is live: an unrestricted load really runs the payload.
    torch.load(directory / victim, weights_only=False)
    assert marker.exists()
    marker.unlink()
    # The recorded hash alone refuses it...
    with pytest.raises(CheckpointError, match=rf"{victim} does not match the XXH3-128 hash recorded") as info:
        accelerator.load_state(directory)
    assert not marker.exists()
    # ...and with a forged manifest, the weights-only loader still refuses it.
    _forge_hash(directory, victim)

    with pytest.raises(UnsafeCheckpointError, match=rf"Refusing to load .*{victim}.*Nothing in it was run") as info:
        accelerator.load_state(directory)
    assert "GLOBAL io.open was not an allowed global" in str(info.value)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("protocol", [2, 5])
def test_raw_pickle_payload_is_refused_and_never_runs(
    checkpoint: tuple[Accelerator, Path], tmp_path: Path, protocol: int
) -> None:
    accelerator, directory = checkpoint
    marker = tmp_path / "payload-ran"
    (directory / "optimizer.bin").write_bytes(pickle.dumps({"state": Payload(marker)}, protocol=protocol))
    _forge_hash(directory, "optimizer.bin")
    with pytest.raises(CheckpointError, match=r"optimizer\.bin"):
        accelerator.load_state(directory)
    assert not marker.exists()


def test_pickle_payload_in_bin_weights_is_refused(tmp_path: Path) -> None:
    accelerator, *_ = _trained()
    directory = Path(accelerator.save_state(tmp_path / "ckpt", safe_serialization=False))
    assert (directory / "model.bin").is_file()
    marker = tmp_path / "payload-ran"
    torch.save({"weight": Payload(marker)}, directory / "model.bin")
    _forge_hash(directory, "model.bin")
    with pytest.raises(UnsafeCheckpointError, match=r"model\.bin"):
        accelerator.load_state(directory)
    assert not marker.exists()


# ---- damaged files ------------------------------------------------------------------------
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.bin", "scheduler.bin"])
@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_damaged_file_names_the_file(tmp_path: Path, victim: str, damage: str) -> None:
    accelerator, _model, opt, _ = _trained()
    sched = accelerator.prepare(torch.optim.lr_scheduler.StepLR(opt, step_size=1))
    opt.step()
    sched.step()
    directory = Path(accelerator.save_state(tmp_path / "ckpt"))
    path = directory / victim
    if damage == "truncate":
        _truncate(path)
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.write_bytes(b"\x00not a checkpoint\xff" * 10)
    with pytest.raises(CheckpointError, match=rf"{victim}.*(truncated or corrupted)") as info:
        accelerator.load_state(directory)
    # Damage is not mistaken for an attack.
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_missing_file_is_named(checkpoint: tuple[Accelerator, Path]) -> None:
    accelerator, directory = checkpoint
    (directory / "optimizer.bin").unlink()
    with pytest.raises(CheckpointError, match=r"optimizer\.bin is missing"):
        accelerator.load_state(directory)


def test_missing_manifest_means_incomplete(checkpoint: tuple[Accelerator, Path]) -> None:
    accelerator, directory = checkpoint
    (directory / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=rf"not a complete accel checkpoint \({MANIFEST} is missing\)"):
        accelerator.load_state(directory)


def test_corrupted_manifest_is_named(checkpoint: tuple[Accelerator, Path]) -> None:
    accelerator, directory = checkpoint
    (directory / MANIFEST).write_text('{"format": 1, "fil')
    with pytest.raises(CheckpointError, match=rf"{MANIFEST} is corrupted"):
        accelerator.load_state(directory)


def test_missing_directory(tmp_path: Path) -> None:
    accelerator, *_ = _trained()
    with pytest.raises(CheckpointError, match="the directory does not exist"):
        accelerator.load_state(tmp_path / "nowhere")


# ---- atomicity under SIGKILL --------------------------------------------------------------
ATOMIC_SCRIPT = """
import os, sys, time
from pathlib import Path
import torch
from accel import Accelerator, ProjectConfiguration

project, victim, manual = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])

class Killer:
    # Registered for checkpointing: its state_dict runs on the writer after the model and
    # optimizer files of the new checkpoint are already in the temporary directory.
    armed = False
    def state_dict(self):
        if self.armed and accelerator.process_index == victim:
            os.kill(os.getpid(), 9)
        return {"armed": self.armed}
    def load_state_dict(self, state):
        pass

def kill_rank_mid_save(rng_state):
    # Rank 1 writes only its RNG file; it dies there once rank 0 has written model and
    # optimizer files into the temporary directory.
    tmp = project / "checkpoints" / "checkpoint_1" / ".accel-staging"
    deadline = time.monotonic() + 60
    while not (tmp / "optimizer.bin").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), 9)

auto = os.environ["ATOMIC_TARGET"] == "auto"
project.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
accelerator = Accelerator(project_config=ProjectConfiguration(
    project_dir=str(project), automatic_checkpoint_naming=auto, total_limit=1 if auto else None))
model = torch.nn.Linear(4, 3)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
killer = Killer()
accelerator.register_for_checkpointing(killer)

def train_step():
    accelerator.backward(model(torch.randn(6, 4)).pow(2).mean())
    opt.step()
    opt.zero_grad()

train_step()
target = None if auto else manual
accelerator.save_state(target)            # checkpoint A (checkpoints/checkpoint_0 or manual)
if accelerator.is_main_process:
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, project / "expected.pt")
train_step()
killer.armed = True
if victim == 1 and accelerator.process_index == 1:
    adapter = accelerator.state.adapter
    get_rng = adapter.get_rng_state
    adapter.get_rng_state = lambda: kill_rank_mid_save(get_rng())
accelerator.save_state(target)            # checkpoint B, same place: one rank dies in the middle
print("save B finished: the kill did not happen", flush=True)
"""


def _load_into_fresh(
    project: Path, input_dir: Path | None
) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, total_limit=1)
    )
    torch.manual_seed(123)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    box = Box()
    accelerator.register_for_checkpointing(box)
    accelerator.load_state(input_dir)
    assert box.state == {"armed": False}
    return accelerator, model, opt


def _assert_equals_saved(model: torch.nn.Module, opt: torch.optim.Optimizer, expected: dict) -> None:
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected["model"][name]), name
    for pid, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(value, expected["opt"]["state"][pid][key]), (pid, key)


@pytest.mark.parametrize(("victim", "target"), [(0, "auto"), (1, "auto"), (0, "manual")])
def test_sigkill_mid_save_keeps_previous_checkpoint(write_script, tmp_path: Path, victim: int, target: str) -> None:
    script = write_script(ATOMIC_SCRIPT)
    project, manual = tmp_path / "project", tmp_path / "manual"
    proc = launch(
        script, str(project), str(victim), str(manual), env={"ATOMIC_TARGET": target}, timeout=180, check=False
    )
    assert proc.returncode != 0, "the killed run must fail"
    assert "save B finished" not in proc.stdout
    assert f"rank {victim}: exit code -9" in proc.stderr, proc.stderr[-3000:]

    expected = torch.load(project / "expected.pt", weights_only=True)
    root = project / "checkpoints"
    half_written = root / "checkpoint_1" if target == "auto" else manual
    tmp = half_written / STAGING
    # The kill really came mid-save: the new checkpoint's files were already being written.
    assert (tmp / "model.safetensors").is_file() and (tmp / "optimizer.bin").is_file()
    assert not (tmp / MANIFEST).exists()
    if target == "manual":
        # Overwriting a checkpoint in place: the old contents stay until the new ones are complete.
        _, model, opt = _load_into_fresh(project, manual)
        _assert_equals_saved(model, opt, expected)
        return
    # Nothing load_state() would pick up is half-written; total_limit=1 did not prune A early.
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_0", "checkpoint_1"]
    assert [p.name for _, p in list_checkpoints(project)] == ["checkpoint_0"]
    accelerator, model, opt = _load_into_fresh(project, None)
    _assert_equals_saved(model, opt, expected)
    # The next save replaces the stale temporary directory and numbers on from A.
    assert Path(accelerator.save_state()) == root / "checkpoint_1"
    assert [p.name for _, p in list_checkpoints(project)] == ["checkpoint_1"]
    assert not (root / "checkpoint_1" / STAGING).exists()


def test_crash_between_the_renames_of_an_overwrite_still_loads(tmp_path: Path) -> None:
    # Overwriting moves the old checkpoint aside, then the new one into place; a crash between
    # the two leaves only `<dir>.accel-old`, which is complete and must still load.
    from accel.checkpoint.state import OLD_SUFFIX

    accelerator, model, _opt, _box = _trained()
    directory = Path(accelerator.save_state(tmp_path / "ckpt"))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    directory.rename(directory.with_name(directory.name + OLD_SUFFIX))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.load_state(directory)
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name
    # The next save puts a checkpoint back under the real name and removes the old one.
    accelerator.save_state(directory)
    assert directory.is_dir() and not directory.with_name(directory.name + OLD_SUFFIX).exists()
