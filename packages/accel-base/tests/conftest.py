"""Shared fixtures: a fresh accel state per test, and a launcher for multi-process scripts (`fresh_state` and
`write_script` come from accel.testing's pytest plugin)."""

from __future__ import annotations

import functools

import pytest
from accel.testing.launching import run_launch


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None) -> None:
    """Each test builds its own Accelerator with its own options (the plugin's `fresh_state`, around every test)."""


# accel-base's own tests keep the caller's ACCEL_* variables (nox sets none).
launch = functools.partial(run_launch, keep_accel_env=True)
