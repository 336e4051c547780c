"""Integration scenarios run through `accel launch` with the adapter named by ACCEL_IT_ADAPTER."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = Path(__file__).parent / "scenarios"


def adapter_args() -> list[str]:
    """`accel launch` flags for the adapter under test: the cpu adapter as is, any other emulated."""
    adapter = os.environ.get("ACCEL_IT_ADAPTER", "cpu")
    return ["--adapter", adapter] if adapter == "cpu" else ["--adapter", adapter, "--emulate"]


def accel_launch(
    script: str | Path, *args: str, nproc: int = 2, launch_args: tuple[str, ...] = (), timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run `script` under `accel launch` for the adapter under test; never fails by itself."""
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc), *adapter_args()]
    cmd += [*launch_args, str(script), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def output(proc: subprocess.CompletedProcess[str]) -> str:
    """Both streams of a finished launch, for assertion messages."""
    return f"exit code {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


@pytest.fixture
def scenario() -> Path:
    """Folder of the scenario scripts."""
    return SCENARIOS
