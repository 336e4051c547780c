"""`save_state(async_save=True)`: the states are copied before it returns, the files are written, hashed and
committed on a background thread, and every guarantee of a synchronous save holds.

The background writer is held at a known point through the file writer it calls (an event it waits for, set
by the test or by the code under test): no sleeps. Kills and exits are real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import background
from accel.checkpoint import state as checkpoint_state
from accel.checkpoint.layout import STAGING
from accel.errors import CheckpointError


def _trained() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator()
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    _step(accelerator, model, opt)
    return accelerator, model, opt


def _step(accelerator: Accelerator, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    accelerator.backward(model(torch.ones(2, 64)).sum())
    opt.step()
    opt.zero_grad()


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _in_background() -> bool:
    return threading.current_thread() is not threading.main_thread()


def test_an_async_save_holds_the_state_of_its_call_and_load_state_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    accelerator, model, opt = _trained()
    saved = _weights(model)
    saved_moments = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    waiting = threading.Event()  # set once load_state has started waiting for the background save
    real_torch, real_finish = checkpoint_state._WRITERS["torch"], background.finish

    in_background: list[str] = []

    def held_writer(state: Any, path: Path) -> str:
        if _in_background():
            assert waiting.wait(120), "load_state never waited for the background save"
            in_background.append(path.name)
        return real_torch(state, path)

    def finish() -> Any:
        waiting.set()
        return real_finish()

    monkeypatch.setitem(checkpoint_state._WRITERS, "torch", held_writer)
    monkeypatch.setattr(background, "finish", finish)
    accelerator.save_state(tmp_path / "ckpt", async_save=True)
    # Training goes on while the background writer is held: the save must not see these steps.
    _step(accelerator, model, opt)
    _step(accelerator, model, opt)
    assert not torch.equal(model.weight, saved["weight"])
    accelerator.load_state(tmp_path / "ckpt")
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert all(torch.equal(v, saved_moments[k]) for k, v in opt.state_dict()["state"][0].items())
    assert not (tmp_path / "ckpt" / STAGING).exists()
    assert "optimizer.bin" in in_background, in_background


def test_a_second_save_waits_for_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator, model, opt = _trained()
    first = _weights(model)
    order: list[str] = []
    real_torch, real_finish = checkpoint_state._WRITERS["torch"], background.finish
    waiting = threading.Event()

    def held_writer(state: Any, path: Path) -> str:
        if _in_background() and path.parent.parent.name == "one":
            assert waiting.wait(120), "the second save never waited for the first"
            order.append("first written")
        return real_torch(state, path)

    def finish() -> Any:
        waiting.set()
        failure = real_finish()
        order.append("waited")
        return failure

    monkeypatch.setitem(checkpoint_state._WRITERS, "torch", held_writer)
    accelerator.save_state(tmp_path / "one", async_save=True)
    monkeypatch.setattr(background, "finish", finish)
    _step(accelerator, model, opt)
    accelerator.save_state(tmp_path / "two", async_save=True)
    # Every file of the first save was written before the second save went on.
    assert order[-1] == "waited" and set(order[:-1]) == {"first written"}, order
    monkeypatch.undo()
    background.finish()
    accelerator.load_state(tmp_path / "one")
    assert all(torch.equal(v, first[k]) for k, v in model.state_dict().items())


def test_a_failed_async_save_is_raised_by_the_next_save_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    accelerator, model, opt = _trained()
    target = tmp_path / "ckpt"
    accelerator.save_state(target)
    before = _weights(model)
    _step(accelerator, model, opt)
    real_torch = checkpoint_state._WRITERS["torch"]

    def full_disk(state: Any, path: Path) -> str:
        if _in_background() and path.parent.parent == target:
            raise OSError(28, "No space left on device", str(path))
        return real_torch(state, path)

    monkeypatch.setitem(checkpoint_state._WRITERS, "torch", full_disk)
    accelerator.save_state(target, async_save=True)  # returns: the failure comes later
    with pytest.raises(
        CheckpointError,
        match=rf"asynchronous save_state\({target}\) failed: .*No space left on device.*optimizer\.bin.*previous one "
        "is intact",
    ):
        accelerator.save_state(tmp_path / "other")
    assert not (target / STAGING).exists() and not (tmp_path / "other").exists()
    accelerator.load_state(target)  # the previous checkpoint, whole
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    accelerator.save_state(tmp_path / "other")  # reported once: the next save goes ahead


KILLED = r"""
import sys, threading
import torch
from accel import Accelerator
from accel.checkpoint import state

accelerator = Accelerator()
model = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
model, opt = accelerator.prepare(model, opt)
with torch.no_grad():
    model.weight.fill_(1.0)
accelerator.save_state(sys.argv[1])
with torch.no_grad():
    model.weight.fill_(2.0)
real = state._WRITERS["torch"]

def writes_then_hangs(obj, path):
    digest = real(obj, path)
    if path.name == "optimizer.bin":
        background = threading.current_thread() is not threading.main_thread()
        sys.stdout.write("writing-in-background\n" if background else "writing-in-the-caller\n")
        sys.stdout.flush()
        if background:
            threading.Event().wait()  # held mid-save until the test kills the process
    return digest

state._WRITERS["torch"] = writes_then_hangs
accelerator.save_state(sys.argv[1], async_save=True)
sys.stdout.write("returned\n"); sys.stdout.flush()
sys.stdin.readline()
"""


def test_a_kill_during_an_async_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    target = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        seen = {proc.stdout.readline().split()[0], proc.stdout.readline().split()[0]}  # type: ignore[union-attr]
        assert seen == {"returned", "writing-in-background"}, seen
        assert (target / STAGING / "optimizer.bin").is_file()  # the new checkpoint was half-written
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(64, 64))
    opt = accelerator.prepare(torch.optim.AdamW(model.parameters(), lr=0.1))
    accelerator.load_state(target)
    assert torch.equal(model.weight, torch.ones(64, 64))
    accelerator.save_state(target)  # and the next save replaces the leftovers
    assert not (target / STAGING).exists()
    del opt


EXITS = r"""
import sys, threading
import torch
from accel import Accelerator
from accel.checkpoint import state

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(64, 64))
with torch.no_grad():
    model.weight.fill_(3.0)
go = threading.Event()
real = state._WRITERS["safetensors"]

def held(obj, path):
    assert go.wait(120)
    return real(obj, path)

state._WRITERS["safetensors"] = held
accelerator.save_state(sys.argv[1], async_save=True)
assert any(t.name == "accel-async-save" and t.is_alive() for t in threading.enumerate())
go.set()  # the script ends with the save still to write: the process must wait for it
"""


def test_the_process_waits_for_an_async_save_at_exit(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    target = tmp_path / "ckpt"
    done = subprocess.run([sys.executable, str(script), str(target)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(64, 64))
    accelerator.load_state(target)
    assert torch.equal(model.weight, torch.full((64, 64), 3.0))


def test_a_failure_no_save_or_load_reported_is_printed_at_exit_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    accelerator = Accelerator()
    accelerator.prepare(torch.nn.Linear(8, 8))
    target = tmp_path / "ckpt"

    def denied(state: Any, path: Path) -> str:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setitem(checkpoint_state._WRITERS, "safetensors", denied)
    accelerator.save_state(target, async_save=True)
    background._at_exit()  # what the interpreter runs at exit (registered with atexit)
    err = capsys.readouterr().err
    assert f"asynchronous save_state({target}) failed" in err, err
    assert "Permission denied" in err and f"{target / STAGING / 'model.safetensors'}" in err, err
    assert not (target / "accel_checkpoint.json").exists() and not (target / STAGING).exists()
    assert background.finish() is None  # reported once


def test_load_state_of_the_latest_automatic_checkpoint_waits_for_the_one_being_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel import ProjectConfiguration

    accelerator = Accelerator(
        project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    )
    model = accelerator.prepare(torch.nn.Linear(8, 8))
    accelerator.save_state()  # checkpoint_0
    with torch.no_grad():
        model.weight.fill_(5.0)
    release = threading.Event()
    real = checkpoint_state._WRITERS["safetensors"]

    def held(state: Any, path: Path) -> str:
        if _in_background():
            assert release.wait(120)
        return real(state, path)

    real_wait = background.wait

    def wait() -> None:
        release.set()  # the background save may go on only once load_state waits for it
        real_wait()

    monkeypatch.setitem(checkpoint_state._WRITERS, "safetensors", held)
    monkeypatch.setattr(background, "wait", wait)
    accelerator.save_state(async_save=True)  # checkpoint_1, held in the background
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state()  # the latest: checkpoint_1, once written
    assert torch.equal(model.weight, torch.full((8, 8), 5.0))
