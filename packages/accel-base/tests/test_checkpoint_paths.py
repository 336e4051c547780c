"""No path outside a checkpoint is read, hashed, followed or deleted, and only accel's own folders are cleaned up.

- Rotation never deletes through a linked `checkpoint_<n>`; a save never removes a folder of the
  user's that happens to carry one of accel's names (`run.accel-tmp/`, `run/.accel-staging/`).
- A manifest naming a path outside the checkpoint, a file linked out of it and a FIFO in a
  file's place are refused by name before anything is read (a FIFO would block forever).
- A data loader's saved generator state of the wrong size is refused with the rest of the checkpoint.
- Ctrl-C during a save surfaces as `KeyboardInterrupt`, never as torch's `unexpected pos` error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from accel import ProjectConfiguration
from accel.checkpoint.layout import STAGING
from accel.checkpoint.state import MANIFEST, TMP_SUFFIX
from accel.errors import CheckpointError
from test_checkpoint_reliability import Setup, assert_same


def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / MANIFEST).read_text())


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _saved(tmp_path: Path) -> tuple[Setup, Path, dict[str, Any]]:
    s = Setup()
    s.train()
    target = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    return s, target, s.snapshot()


def _within(seconds: float, fn: Callable[[], Any], fifo: Path | None = None) -> BaseException | None:
    """Run `fn` in a thread; fail (unblocking a reader stuck on `fifo`) if it takes longer than `seconds`."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # EOF for the blocked reader
        pytest.fail(f"still reading after {seconds} s: it opened the FIFO and waits for a writer")
    return outcome[0]


# ---- rotation and cleanup never follow links, never remove a user's folder ----------------------
def test_rotation_skips_a_linked_checkpoint_and_never_deletes_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    s = Setup()
    s.accelerator.save_state(elsewhere)
    (elsewhere / "notes.txt").write_text("mine")
    before = sorted(p.name for p in elsewhere.iterdir())
    project = tmp_path / "project"
    (project / "checkpoints").mkdir(parents=True)
    (project / "checkpoints" / "checkpoint_0").symlink_to(elsewhere, target_is_directory=True)
    s.accelerator.project_configuration = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=1, iteration=1
    )
    for n in (1, 2):
        s.train()
        with pytest.warns(UserWarning, match=r"rotation \(total_limit\) skips .*checkpoint_0: a symbolic link"):
            assert s.accelerator.save_state() == str(project / "checkpoints" / f"checkpoint_{n}")
    assert sorted(p.name for p in elsewhere.iterdir()) == before
    assert (project / "checkpoints" / "checkpoint_0").is_symlink()
    assert sorted(p.name for p in (project / "checkpoints").iterdir()) == ["checkpoint_0", "checkpoint_2"]


def test_a_user_folder_named_like_accels_old_temporary_is_kept(tmp_path: Path) -> None:
    mine = tmp_path / f"run{TMP_SUFFIX}"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    s = Setup()
    s.accelerator.save_state(tmp_path / "run")
    s.accelerator.save_state(tmp_path / "run")
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_user_folder_in_accels_staging_place_stops_the_save_and_is_kept(tmp_path: Path) -> None:
    s, target, _ = _saved(tmp_path)
    (target / STAGING).mkdir()
    (target / STAGING / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"\.accel-staging is in the way.*not accel's.*move or rename it"):
        s.accelerator.save_state(target)
    assert (target / STAGING / "notes.txt").read_text() == "mine"
    fresh = Setup(seed=1)
    fresh.accelerator.load_state(target)  # the previous checkpoint is intact


# ---- nothing outside the checkpoint is read --------------------------------------------------------
@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_manifest_naming_a_file_outside_is_refused(tmp_path: Path, how: str) -> None:
    s, target, _ = _saved(tmp_path)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the checkpoint's")
    name = "shards/../../outside.bin" if how == "dotdot" else str(outside)
    manifest = _manifest(target)
    manifest["strategy_files"] = [name.split("/")[0]]
    manifest["sha256"][name] = hashlib.sha256(outside.read_bytes()).hexdigest()
    _write_manifest(target, manifest)
    with pytest.raises(CheckpointError, match=r"names .*outside\.bin.*which is not a file inside the checkpoint"):
        s.accelerator.load_state(target)


def test_a_fifo_a_manifest_names_is_refused_without_blocking(tmp_path: Path) -> None:
    s, target, _ = _saved(tmp_path)
    (target / "shards").mkdir()
    os.mkfifo(target / "shards" / "0.distcp")
    manifest = _manifest(target)
    manifest["strategy_files"] = ["shards"]
    manifest["sha256"]["shards/0.distcp"] = "0" * 64
    _write_manifest(target, manifest)
    s.train()
    error = _within(20, lambda: s.accelerator.load_state(target), fifo=target / "shards" / "0.distcp")
    assert isinstance(error, CheckpointError), error
    assert re.search(r"shards/0\.distcp is a FIFO, not a regular file", str(error)), error


def test_a_weights_file_linked_out_of_the_checkpoint_is_named(tmp_path: Path) -> None:
    s, target, _ = _saved(tmp_path)
    (target / "model.safetensors").unlink()
    (target / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is a link to /dev/zero, outside the checkpoint"):
        s.accelerator.load_state(target)


def test_a_fifo_in_a_files_place_is_refused_by_type(tmp_path: Path) -> None:
    s, target, _ = _saved(tmp_path)
    (target / "optimizer.bin").unlink()
    os.mkfifo(target / "optimizer.bin")
    s.train()
    with pytest.raises(CheckpointError, match=r"optimizer\.bin is a FIFO, not a regular file"):
        s.accelerator.load_state(target)


# ---- sharded folders: the files their metadata names ------------------------------------------
def _sharded_folder(tmp_path: Path) -> Path:
    """A torch.distributed.checkpoint folder of one process, as an FSDP2 sharded save writes it."""
    import torch
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "pytorch_model_fsdp_0"
    with pytest.warns(UserWarning, match="torch.distributed"):
        dcp.save({"model": {"w": torch.arange(6.0)}}, checkpoint_id=str(folder), no_dist=True)
    return folder


def _repoint(folder: Path, relative_path: str) -> None:
    """Rewrite `.metadata` so that every item says it is stored in `relative_path`."""
    import pickle

    metadata = pickle.loads((folder / ".metadata").read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = relative_path
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize("reader", ["read_full", "load_into"])
def test_sharded_metadata_naming_a_file_outside_its_folder_is_refused(tmp_path: Path, reader: str) -> None:
    import torch
    from accel.checkpoint import dcp

    folder = _sharded_folder(tmp_path)
    assert dcp.read_full(folder)["model"]["w"].tolist() == [0, 1, 2, 3, 4, 5]
    (tmp_path / "outside.distcp").write_bytes(next(folder.glob("*.distcp")).read_bytes())
    _repoint(folder, "../outside.distcp")
    read = (
        (lambda: dcp.read_full(folder))
        if reader == "read_full"
        else (lambda: dcp.load_into({"model": {"w": torch.zeros(6)}}, folder, no_dist=True))
    )
    with pytest.raises(CheckpointError, match=r"points at '\.\./outside\.distcp', which is not a file in"):
        read()


def test_a_fifo_in_a_shards_place_is_refused_without_blocking(tmp_path: Path) -> None:
    from accel.checkpoint import dcp

    folder = _sharded_folder(tmp_path)
    shard = next(folder.glob("*.distcp"))
    shard.unlink()
    os.mkfifo(shard)
    error = _within(20, lambda: dcp.read_full(folder), fifo=shard)
    assert isinstance(error, CheckpointError), error
    assert re.search(rf"{shard.name} is a FIFO, not a regular file", str(error)), error


# ---- data loader generator states -------------------------------------------------------------
def test_a_loader_generator_state_of_the_wrong_size_is_refused_and_nothing_loads(tmp_path: Path) -> None:
    s = Setup()
    s.train()
    next(iter(s.loader))  # mid-epoch: the checkpoint holds the epoch's generator states
    target = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    states = json.loads((target / "dataloaders.json").read_text())
    (name, text), *_ = states[0]["epoch_rng"].items()
    states[0]["epoch_rng"][name] = base64.b64encode(base64.b64decode(text)[:-16]).decode()
    data = json.dumps(states).encode()
    (target / "dataloaders.json").write_bytes(data)
    manifest = _manifest(target)
    manifest["sha256"]["dataloaders.json"] = hashlib.sha256(data).hexdigest()
    _write_manifest(target, manifest)
    s.train()
    before = s.snapshot()
    with pytest.raises(CheckpointError, match=rf"dataloaders\.json holds a '{name}' generator state of \d+ bytes"):
        s.accelerator.load_state(target)
    assert_same(s.snapshot(), before)


# ---- Ctrl-C -------------------------------------------------------------------------------------
@pytest.mark.parametrize("nth_write", [2, 4, 9])
def test_ctrl_c_during_a_save_raises_keyboard_interrupt(tmp_path: Path, nth_write: int) -> None:
    s, target, expected = _saved(tmp_path)
    s.train()
    writes = [0]

    def interrupt_at_a_write(frame: Any, event: str, arg: Any) -> None:
        # A real SIGINT, sent while torch's archive writer is writing through accel's hashing file.
        if event == "call" and frame.f_code.co_name == "write" and frame.f_code.co_filename.endswith("io.py"):
            writes[0] += 1
            if writes[0] == nth_write:
                os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler: an earlier test in this process may have run torchrun in-process,
    # which installs its own SIGINT handler and leaves it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.setprofile(interrupt_at_a_write)
    try:
        with pytest.raises(KeyboardInterrupt):
            s.accelerator.save_state(target)
    finally:
        sys.setprofile(None)
        signal.signal(signal.SIGINT, previous)
    assert writes[0] >= nth_write
    assert not (target / STAGING).exists()
    fresh = Setup(seed=1)
    fresh.accelerator.load_state(target)
    expected["rng"] = fresh.snapshot()["rng"]
    assert_same(fresh.snapshot(), expected)
