"""Fixtures: a fresh accel state per test on torch_xla's real CPU device (`PJRT_DEVICE=CPU`),
and a launcher that runs a worker script on 2 gloo processes through
`accel launch --adapter xla --emulate`."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable

import pytest
from accel.testing.launching import run_launch

# torch_xla reads it when its runtime starts (first device use), once per process.
os.environ.setdefault("PJRT_DEVICE", "CPU")

try:
    import torch_xla
except ImportError:  # the emulated tests run without it
    pass
else:
    # Start the runtime before any backward in this process: autograd sizes its per-device
    # queues at the first backward, and XLA devices counted only later fail an internal
    # assert in the engine (seen when a CPU-only test ran first).
    torch_xla.device()

EMULATED = ("--adapter", "xla", "--emulate")


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds its own Accelerator (the plugin's `fresh_state`) on the xla adapter, unemulated unless
    it says so."""
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("ACCEL_ADAPTER", "xla")


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return EMULATED


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 300


# Under torch 2.9 a gloo worker sometimes aborts after its script finished (accel.testing.launching.TEARDOWN_ABORT):
# that one signature gets one more launch.
@pytest.fixture(scope="session")
def launch(
    accel_launch_args: tuple[str, ...], accel_launch_timeout: float
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The plugin's `launch`, retried once on torch's teardown abort."""
    return functools.partial(
        run_launch, launch_args=accel_launch_args, timeout=accel_launch_timeout, retry_teardown_abort=True
    )
