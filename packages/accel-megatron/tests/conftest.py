"""Fixtures: a fresh accel state per test, and a launcher that runs a worker on gloo processes
through `accel launch` (the CPU adapter: megatron-core's CUDA lookups go to the CPU)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from accel.testing.launching import run_launch as _run_launch

WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test builds its own Accelerator (the plugin's `fresh_state`); options come only from what the
    test sets."""
    for var in [v for v in os.environ if v.startswith("ACCEL_")]:
        monkeypatch.delenv(var)


# Megatron's workers build models of their own and take longer than the plugin's default.
run_launch = functools.partial(_run_launch, timeout=540)


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 540


@pytest.fixture
def megatron_world():
    """One process's megatron-core parallel state, torn down afterwards (the next test starts clean)."""
    pytest.importorskip("megatron.core")
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
