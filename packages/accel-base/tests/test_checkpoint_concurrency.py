"""Saves and loads from separate processes into one directory: a load always sees one complete save.

Real processes, coordinated through pipes (no sleeps): the test saves a first checkpoint, starts
two writer processes, and once both are ready tells them to go; each then saves in a loop into
the same directory while the test itself loads in a loop until both have exited, then once more.
Every save writes one value into every weight and into a registered object, so a load that
mixed two saves, or read a save's files in flight, shows. The writers take turns (the save
lock), and the reader never runs the interrupted-commit recovery on files a live writer is
moving, nor reads while one swaps them in (the files lock).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import lock
from accel.checkpoint.lock import SAVE_LOCK
from accel.errors import CheckpointError
from accel.state import AcceleratorState, GradientState
from test_checkpoint_reliability import Box, Setup

WRITER = r"""
import sys
import torch
from accel import Accelerator

directory, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


class Box:
    value = 0
    def state_dict(self):
        return {"value": self.value}
    def load_state_dict(self, state):
        self.value = int(state["value"])


accelerator = Accelerator()
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model, optimizer = accelerator.prepare(model, optimizer)
box = Box()
accelerator.register_for_checkpointing(box)
print("ready", flush=True)
sys.stdin.readline()  # go: the reader is loading
for value in range(first, first + count):
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    box.value = value
    accelerator.save_state(directory)
"""


def _python(script: Path, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, str(script), *args], text=True, env=env, **kwargs
    )


def _reader(directory: Path) -> tuple[Accelerator, torch.nn.Module, Box]:
    """The objects the writers save, built here; saves the checkpoint the writers start from (value 0)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator()
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    box = Box()
    accelerator.register_for_checkpointing(box)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    accelerator.save_state(directory)
    return accelerator, model, box


def test_concurrent_writers_and_a_reader_see_only_complete_saves(tmp_path: Path) -> None:
    script, directory = tmp_path / "writer.py", tmp_path / "ckpt"
    script.write_text(WRITER)
    accelerator, model, box = _reader(directory)
    count = 12
    writers = [
        _python(script, str(directory), str(first), str(count), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for first in (1, 1001)
    ]
    for writer in writers:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    for writer in writers:
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.close()
    seen, failures = [], []
    while True:
        last = all(writer.poll() is not None for writer in writers)  # then one more load: their last save
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(-1)
        try:
            accelerator.load_state(directory)
            weights = {float(v) for p in model.parameters() for v in p.detach().flatten()}
            if weights != {float(box.value)}:
                failures.append(f"mixed load: weights {sorted(weights)[:4]}, object {box.value}")
            seen.append(box.value)
        except CheckpointError as exc:
            failures.append(str(exc)[:300])
        if last:
            break
    assert [writer.returncode for writer in writers] == [0, 0]
    assert failures == []
    assert set(seen) <= {0, *range(1, 1 + count), *range(1001, 1001 + count)}
    assert seen[-1] in (count, 1000 + count)  # after both finished: one of their last saves, whole
    assert len(seen) >= 2
    assert not list(directory.glob(".accel-*"))  # no lock file or staging directory stays behind


def test_a_save_or_load_waits_for_a_held_lock_then_fails_naming_the_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel.checkpoint.lock import CheckpointLocks

    s = Setup()
    directory = Path(s.accelerator.save_state(tmp_path / "ckpt"))
    # flock locks of two open files conflict within one process too: this stands for another process.
    other = CheckpointLocks(directory, "save_state(elsewhere)")
    other.for_save()
    other.change_files()
    monkeypatch.setattr(lock, "WAIT_SECONDS", 0.5)
    try:
        name = rf"pid {os.getpid()} on host {socket.gethostname()} \(save_state\(elsewhere\), since"
        with pytest.raises(CheckpointError, match=rf"save_state\(.*ckpt\): .*ckpt is in use by {name}"):
            s.accelerator.save_state(directory)
        with pytest.raises(CheckpointError, match=rf"load_state\(.*ckpt\): .*ckpt is in use by {name}"):
            s.accelerator.load_state(directory)
        assert (directory / SAVE_LOCK).exists()
    finally:
        other.release()
    s.accelerator.save_state(directory)
    s.accelerator.load_state(directory)
    assert not (directory / SAVE_LOCK).exists()


def test_rotation_keeps_a_checkpoint_a_load_is_still_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel import ProjectConfiguration
    from accel.checkpoint.lock import CheckpointLocks

    s = Setup()
    s.accelerator.project_configuration = ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=1
    )
    first = Path(s.accelerator.save_state())
    files = sorted(p.name for p in first.iterdir())
    reading = CheckpointLocks(first, "load_state(elsewhere)")
    reading.for_reading()  # another load, still reading the oldest checkpoint
    monkeypatch.setattr(lock, "WAIT_SECONDS", 0.3)
    try:
        with pytest.warns(UserWarning, match=r"Kept checkpoint .*checkpoint_0: .*is in use by"):
            s.accelerator.save_state()
        assert sorted(p.name for p in first.iterdir() if p.name != ".accel-files.lock") == files
    finally:
        reading.release()
    s.accelerator.save_state()  # the reader is gone: rotation removes both older ones
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_2"]
