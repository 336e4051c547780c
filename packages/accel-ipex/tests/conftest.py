"""Fixtures: a fresh accel state per test, IPEX options only from what a test sets, and a launcher
that runs a worker script on 2 gloo processes through `accel launch --adapter ipex`."""

from __future__ import annotations

import os

import pytest

IPEX = ("--adapter", "ipex")


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds its own Accelerator (the plugin's `fresh_state`); IPEX options come only from what
    the test sets."""
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return IPEX


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 480
