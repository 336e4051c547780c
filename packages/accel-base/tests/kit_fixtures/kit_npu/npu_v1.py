"""A contract-1 adapter's stand-in, written before the kit drew from `generator(index)`: seeding and
the RNG state only, on one host generator per device."""

from __future__ import annotations

from accel.testing.emulated import DeviceGenerators, device_count_from_env

_rng = DeviceGenerators(lambda: device_count_from_env("ASCEND_RT_VISIBLE_DEVICES"))


def device_count() -> int:
    return device_count_from_env("ASCEND_RT_VISIBLE_DEVICES")


def set_device(index: int) -> None:
    """Nothing to make current on the host."""


def get_rng_state() -> list:
    return _rng.get_rng_state()


def set_rng_state(states: list) -> None:
    _rng.set_rng_state(states)


def manual_seed(seed: int) -> None:
    _rng.manual_seed(seed)


REAL_FUNCTIONS = ("device_count", "set_device", "get_rng_state", "set_rng_state", "manual_seed", "synchronize")
"""The real module (not importable here) has these."""
