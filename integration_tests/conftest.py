"""Integration scenarios run through `accel launch` with the adapter named by ACCEL_IT_ADAPTER."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).parent / "scenarios"


def adapter_args() -> list[str]:
    """`accel launch` flags for the adapter under test: the cpu adapter as is, any other emulated."""
    adapter = os.environ.get("ACCEL_IT_ADAPTER", "cpu")
    return ["--adapter", adapter] if adapter == "cpu" else ["--adapter", adapter, "--emulate"]


def _launch(
    script: str | Path, *args: str, nproc: int = 2, launch_args: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc), *adapter_args()]
    cmd += [*launch_args, str(script), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


# Fixtures rather than importable helpers: `from conftest import ...` would pick up
# packages/*/tests/conftest.py instead when both folders run in one pytest session.
@pytest.fixture
def accel_launch() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`accel_launch(script, *args, nproc=2, launch_args=(), timeout=300)`: run `script` under
    `accel launch` for the adapter under test and return the finished process (never fails by itself)."""
    return _launch


@pytest.fixture
def scenario() -> Path:
    """Folder of the scenario scripts."""
    return SCENARIOS
