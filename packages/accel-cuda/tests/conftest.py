"""Fixtures: a fresh accel state and fresh emulated-GPU records per test, a launcher that runs a
worker script on 2 gloo processes through `accel launch --adapter cuda --emulate`, and the
marker for tests that need a real GPU."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from accel.precision import fp8_emulation
from accel_cuda import cuda_emulated

EMULATED = ("--adapter", "cuda", "--emulate")

requires_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason=f"needs an NVIDIA GPU (torch {torch.__version__}, CUDA build {torch.version.cuda}, sees none); "
    "hardware_ci/cuda/run.sh runs these on one",
)


def _reset_emulation() -> None:
    cuda_emulated.calls.clear()
    cuda_emulated.current_device.clear()
    cuda_emulated.group_started_at_set_device.clear()
    cuda_emulated._rng.reset()
    cuda_emulated.tf32.update(matmul=False, cudnn=True)
    cuda_emulated.installed_fp8_backends.clear()
    cuda_emulated.installed_fp8_backends.update({"te", "ao"})
    cuda_emulated.mxfp8["supported"] = True
    cuda_emulated.fsdp_scale_precomputes.clear()
    cuda_emulated.machine.update(gpus=[], driver="550.54.14")
    fp8_emulation._active.clear()


@pytest.fixture(autouse=True)
def fresh_state(fresh_state: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test builds its own Accelerator (the plugin's `fresh_state`) on fresh emulated-GPU records;
    adapter options come only from what the test sets."""
    for var in [v for v in os.environ if v.startswith("ACCEL_") or v == "CUDA_VISIBLE_DEVICES"]:
        monkeypatch.delenv(var)
    _reset_emulation()
    yield
    _reset_emulation()


@pytest.fixture(scope="session")
def accel_launch_args() -> tuple[str, ...]:
    """What the `launch` fixture (accel.testing's pytest plugin) passes to `accel launch`."""
    return EMULATED


@pytest.fixture(scope="session")
def accel_launch_timeout() -> float:
    return 600
