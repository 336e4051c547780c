"""Fixtures: a fresh accel state per test, IPEX options only from what a test sets, and a launcher
that runs a worker script on 2 gloo processes through `accel launch --adapter ipex`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from accel.state import AcceleratorState, GradientState

IPEX = ("--adapter", "ipex")


def _reset() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test builds its own Accelerator; IPEX options come only from what the test sets."""
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)
    _reset()
    yield
    _reset()


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return IPEX


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 480
