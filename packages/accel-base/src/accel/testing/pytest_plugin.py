"""pytest fixtures for adapter packages' multi-process tests (registered as the `accel` pytest plugin).

- `launch(script, *args, nproc=2, launch_args=..., env=None, timeout=..., check=True)`: run a
  worker script through `accel launch` (see `accel.testing.launching.run_launch`).
- `write_script(code, name="worker.py")`: write dedented code into the test's tmp dir.
- `accel_launch_args` / `accel_launch_timeout`: what `launch` uses by default; a package's
  conftest overrides them once, e.g. `("--adapter", "mydevice", "--emulate")`.
- `fresh_state`: forget the accel state before and after a test. Not autouse: a package that wants it
  around every test overrides it in its conftest with an autouse fixture of the same name that requests
  it (and resets its own records there).

A fixture of the same name in a conftest wins over these, as pytest's rules say.
"""

from __future__ import annotations

import functools
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..distributed.state import AcceleratorState, GradientState
from .launching import run_launch


def reset_state() -> None:
    """Forget `PartialState`, `AcceleratorState` and `GradientState` now (what `fresh_state` does around a test),
    for a test that builds a second Accelerator of its own mid-way."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def fresh_state() -> Iterator[None]:
    """Forget `PartialState`, `AcceleratorState` and `GradientState` before the test and after it, so the
    test's own `Accelerator(...)` decides every option and leaves nothing to the next test.

    The process group, if one was started, is not destroyed. To have it around every test of a package:

        @pytest.fixture(autouse=True)
        def fresh_state(fresh_state: None) -> None:
            pass
    """
    reset_state()
    yield
    reset_state()


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """Launch flags every `launch` call gets unless it passes its own (default: none)."""
    return ()


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    """Seconds a launch may take before the test fails."""
    return 300.0


@pytest.fixture(scope="session")
def launch(
    accel_launch_args: tuple[str, ...], accel_launch_timeout: float
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`launch(script, *args, nproc=2, launch_args=accel_launch_args, env=None, check=True)`."""
    return functools.partial(run_launch, launch_args=accel_launch_args, timeout=accel_launch_timeout)


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[..., Path]:
    """Write a worker script (dedented) into the test's tmp dir and return its path."""

    def _write(code: str, name: str = "worker.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(code))
        return path

    return _write
