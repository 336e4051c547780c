"""A real vendor module whose seeding is named otherwise than the stand-in's (`manual_seed_all`): on the
hardware the base's `manual_seed` would look up `manual_seed` and silently do nothing."""

from __future__ import annotations

from kit_npu.npu import GradScaler, device_count, get_rng_state, set_device, set_rng_state

__all__ = ["GradScaler", "device_count", "get_rng_state", "manual_seed_all", "set_device", "set_rng_state"]


def manual_seed_all(seed: int) -> None:
    raise RuntimeError("no NPU in the kit's own tests")
