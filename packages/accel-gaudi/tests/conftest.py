"""Fixtures: a fresh accel state and fresh emulated-device counters per test, and a launcher
that runs a worker script on 2 gloo processes through `accel launch --adapter gaudi --emulate`."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from accel.precision import fp8_emulation
from accel_gaudi import hpu_emulated
from accel_gaudi.autocast_ops import FP32_LIST_ENV, LOWER_PRECISION_LIST_ENV

EMULATED = ("--adapter", "gaudi", "--emulate")


def _reset_emulation() -> None:
    hpu_emulated.calls.clear()
    hpu_emulated._op_lists.clear()  # the emulated bridge reads its autocast op lists again
    fp8_emulation._active.clear()


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test builds its own Accelerator (the plugin's `fresh_state`) on fresh emulated-device counters;
    Gaudi options come only from what the test sets."""
    for var in [v for v in os.environ if v.startswith("ACCEL_") or v.startswith("PT_HPU_")]:
        monkeypatch.delenv(var)
    _reset_emulation()
    yield
    _reset_emulation()
    # The adapter declares autocast op lists in os.environ itself (as optimum-habana does): not past this test.
    for var in (LOWER_PRECISION_LIST_ENV, FP32_LIST_ENV):
        os.environ.pop(var, None)


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return EMULATED


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 300
