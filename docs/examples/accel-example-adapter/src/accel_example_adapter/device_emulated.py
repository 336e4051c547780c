"""The CPU stand-in for `device`: same functions, no hardware."""

from __future__ import annotations

from accel.testing.emulated import DeviceGenerators, device_count_from_env

steps = 0
current: int | None = None
_rng = DeviceGenerators(lambda: device_count())  # one real torch.Generator per emulated device
generator, get_rng_state, set_rng_state, manual_seed = (
    _rng.generator,
    _rng.get_rng_state,
    _rng.set_rng_state,
    _rng.manual_seed,
)


def device_count() -> int:
    return device_count_from_env("EXAMPLE_VISIBLE_DEVICES")  # else one per local process


def set_device(index: int) -> None:
    global current
    current = index


def mark_step() -> None:
    global steps
    steps += 1


def has_fused_adamw() -> bool:
    return True  # as the device says: the decision it drives is made under emulation too
