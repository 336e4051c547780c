"""Fixtures: a fresh accel state per test, and a launcher that runs a worker on gloo processes
through `accel launch` (the CPU adapter: megatron-core's CUDA lookups go to the CPU)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from accel.state import AcceleratorState, GradientState
from accel.testing.launching import run_launch as _run_launch

WORKERS = Path(__file__).parent / "workers"


def _reset() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)
    _reset()
    yield
    _reset()


# Megatron's workers build models of their own and take longer than the plugin's default.
run_launch = functools.partial(_run_launch, timeout=540)


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 540
