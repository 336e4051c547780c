"""The stand-in for `accel_ipex.ipex`: real IPEX on the CPU, an emulated Intel XPU host around it.

IPEX's CPU calls (`ipex.optimize`, the bf16-prepack check, oneCCL's import) run for real, imported
from `accel_ipex.ipex`. What needs an Intel GPU or a torch built for it has a stand-in of the same
name: `torch.xpu`'s device, memory and RNG calls, and `torch.distributed`'s `is_xccl_available` /
`is_mpi_available`. The emulated host has no XPU unless `ACCEL_IPEX_EMULATED_XPUS` (or a test, through
`machine`) says how many; with some, the adapter takes its XPU path (`on_xpu`, `MULTI_XPU`, the XPU
backend choice, device RNG and memory calls into this module) while the run stays on `cpu` and `gloo`.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch
from accel.testing.emulated import DeviceGenerators

from .ipex import (  # noqa: F401  (the real IPEX calls: IPEX runs on the CPU)
    VERSION,
    bf16_prepack_supported,
    ccl_available,
    optimize_for_inference,
    optimize_for_training,
)

machine: dict[str, Any] = {
    "xpus": int(os.environ.get("ACCEL_IPEX_EMULATED_XPUS") or 0),
    "xccl": True,  # torch 2.8's XPU builds have xccl
    "mpi": False,  # pip's torch has no mpi backend
}
"""The emulated host: how many XPUs, and whether its torch has the `xccl` and `mpi` backends (tests change it)."""
calls: Counter[str] = Counter()
"""How many times each device-only call was made (reset it between tests)."""
current_device: list[int] = []
"""Indices passed to `set_device`, in order."""
_rng = DeviceGenerators(lambda: max(device_count(), 1))


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return int(machine["xpus"])


def set_device(device: torch.device) -> None:
    calls["set_device"] += 1
    current_device.append(torch.device(device).index or 0)


def empty_cache() -> None:
    calls["empty_cache"] += 1


def memory_stats(device: torch.device | None = None) -> dict[str, Any]:
    calls["memory_stats"] += 1
    return {"allocated_bytes.all.current": 0, "reserved_bytes.all.current": 0} if is_available() else {}


def generator(index: int = 0) -> torch.Generator:
    """Emulated XPU `index`'s generator (tests draw from it as XPU code draws from the device's)."""
    return _rng.generator(index)


def get_rng_state_all() -> list[torch.Tensor]:
    return _rng.get_rng_state()


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    _rng.set_rng_state(states)


def manual_seed_all(seed: int) -> None:
    _rng.manual_seed(seed)


def is_xccl_available() -> bool:
    return bool(machine["xccl"])


def is_mpi_available() -> bool:
    return bool(machine["mpi"])
