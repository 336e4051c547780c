"""Shared fixtures: a fresh accel state per test, and a launcher for multi-process scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from accel.state import AcceleratorState, GradientState


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Each test builds its own Accelerator with its own options."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def launch(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    launch_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `script` through `accel launch --num-processes nproc` and return the finished process.

    With `check`, a non-zero exit fails the test and shows the workers' output.
    """
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc), *launch_args, str(script), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"launch failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture
def write_script(tmp_path: Path):
    """Write a worker script (dedented) into the test's tmp dir and return its path."""

    def _write(code: str, name: str = "worker.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(code))
        return path

    return _write
