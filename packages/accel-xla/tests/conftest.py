"""Fixtures: a fresh accel state per test on torch_xla's real CPU device (`PJRT_DEVICE=CPU`),
and a launcher that runs a worker script on 2 gloo processes through
`accel launch --adapter xla --emulate`."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from accel.state import AcceleratorState, GradientState
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


def _reset() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test builds its own Accelerator on the xla adapter, unemulated unless it says so."""
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("ACCEL_ADAPTER", "xla")
    _reset()
    yield
    _reset()


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return EMULATED


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 300


# Under torch 2.9 (the torch torch_xla 2.9 needs), a gloo worker aborts about once in 30
# launches *after* its script has finished and its process group was destroyed, during
# interpreter finalization ("terminate called without an active exception", no Python
# frame; measured 2 of 60 runs of test_distributed.py here, never under torch 2.13). That
# one signature, and only it, gets one more launch; any other failure fails at once.
TEARDOWN_ABORT = "terminate called without an active exception"


@pytest.fixture(scope="session")
def launch(
    accel_launch_args: tuple[str, ...], accel_launch_timeout: float
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """The plugin's `launch`, retried once when a worker hit torch 2.9's teardown abort."""

    def run(script: Any, *args: str, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("launch_args", accel_launch_args)
        kwargs.setdefault("timeout", accel_launch_timeout)
        proc = run_launch(script, *args, check=False, **kwargs)
        if proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr:
            warnings.warn(
                f"worker aborted at interpreter exit (torch 2.9 gloo teardown); relaunching {script}", stacklevel=2
            )
            proc = run_launch(script, *args, check=False, **kwargs)
        if check and proc.returncode != 0:
            pytest.fail(
                f"launch failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-8000:]}"
            )
        return proc

    return run
