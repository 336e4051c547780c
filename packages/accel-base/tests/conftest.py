"""Shared fixtures: a fresh accel state per test, and a launcher for multi-process scripts (`write_script`
comes from accel.testing's pytest plugin)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
from accel.state import AcceleratorState, GradientState
from accel.testing.launching import run_launch


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Each test builds its own Accelerator with its own options."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# accel-base's own tests keep the caller's ACCEL_* variables (nox sets none).
launch = functools.partial(run_launch, keep_accel_env=True)
