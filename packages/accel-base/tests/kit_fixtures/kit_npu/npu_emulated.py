"""The CPU stand-in for the fixture NPU's vendor module, built on `accel.testing.emulated`."""

from __future__ import annotations

from collections import Counter

import torch
from accel.testing.emulated import DeviceGenerators, device_count_from_env

calls: Counter[str] = Counter()
_rng = DeviceGenerators(lambda: device_count_from_env("NPU_VISIBLE_DEVICES"))


class GradScaler(torch.amp.GradScaler):
    """Stands for the vendor's own loss scaler."""


def device_count() -> int:
    return device_count_from_env("NPU_VISIBLE_DEVICES")


def set_device(index: int) -> None:
    calls["set_device"] += 1


def generator(index: int = 0) -> torch.Generator:
    return _rng.generator(index)


def get_rng_state() -> list[torch.Tensor]:
    return _rng.get_rng_state()


def set_rng_state(states: list[torch.Tensor]) -> None:
    _rng.set_rng_state(states)


def manual_seed(seed: int) -> None:
    _rng.manual_seed(seed)


def empty_cache() -> None:
    calls["empty_cache"] += 1
