"""Every call into the example device's vendor library, and nothing else."""

from __future__ import annotations

import os

import torch

steps = 0
current: int | None = None
_generators: list[torch.Generator] = []


def _present() -> None:
    if os.environ.get("EXAMPLE_DEVICE") != "1":
        raise RuntimeError("the example device is not present")


def device_count() -> int:
    """Example devices on this host: one per local process."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def set_device(index: int) -> None:
    """Make device `index` current for this process (a real library binds its runtime to it)."""
    global current
    _present()
    if not 0 <= index < device_count():
        raise ValueError(f"no example device {index}: this host has {device_count()}")
    current = index


def generator(index: int = 0) -> torch.Generator:
    """Device `index`'s random generator (device code draws from it: dropout masks, random init)."""
    while len(_generators) < device_count():
        _generators.append(torch.Generator())
    return _generators[index]


def manual_seed(seed: int) -> None:
    """Seed every device's generator."""
    for index in range(device_count()):
        generator(index).manual_seed(seed)


def get_rng_state() -> list[torch.Tensor]:
    """Every device generator's state, for checkpoints."""
    return [generator(index).get_state() for index in range(device_count())]


def set_rng_state(states: list[torch.Tensor]) -> None:
    """Restore `get_rng_state`'s result."""
    for index, state in enumerate(states):
        generator(index).set_state(state)


def mark_step() -> None:
    """Tell the device one optimizer step is done (a real vendor library would flush its queue here)."""
    global steps
    _present()
    steps += 1


def has_fused_adamw() -> bool:
    """Whether the device's library has a fused AdamW kernel (the adapter then asks for it)."""
    return os.environ.get("EXAMPLE_DEVICE") == "1"
