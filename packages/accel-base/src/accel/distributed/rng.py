"""Random-number generators kept equal across processes, as Accelerate does it.

`synchronize_rng_states(["generator"], g)` copies rank 0's state of `g` to every rank. A
prepared data loader does this at the start of every iteration over it (the Accelerator's
`rng_types`, default `["generator"]`: the shuffling sampler's generator), so every rank
draws the same shuffle while dropout and the other users of the global generator keep
their own streams.

Names: `"torch"` is the global CPU generator, `"generator"` the `generator` argument; any
other name (Accelerate names device generators after their hardware) means the device generators of the
adapter in use, which must have some.
"""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist


class RNGType(str, enum.Enum):
    """The generators `synchronize_rng_state` knows by name (device generators: any other name)."""

    TORCH = "torch"
    GENERATOR = "generator"


def synchronize_rng_state(rng_type: str | RNGType | None = None, generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's state of one generator (see the module docstring for names).

    Raises:
        ValueError: `"generator"` without a generator, or a device generator the adapter lacks.
    """
    name = rng_type.value if isinstance(rng_type, RNGType) else str(rng_type)
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if name == RNGType.TORCH:
        state = _broadcast(torch.get_rng_state()) if distributed else None
        if state is not None:
            torch.set_rng_state(state)
        return
    if name == RNGType.GENERATOR:
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator to synchronize.")
        if distributed:
            generator.set_state(_broadcast(generator.get_state()))
        return
    from .state import PartialState

    adapter = PartialState().adapter
    device_state = adapter.get_device_rng_state()
    if device_state is None:
        raise ValueError(
            f"rng_types contains {name!r}, but the {type(adapter).__name__} in use has no device generator: "
            "use rng_types=['torch', 'generator'] (or the name of the device generator on hardware that has one)."
        )
    if distributed:
        box = [device_state]
        dist.broadcast_object_list(box, src=0)
        adapter.set_device_rng_state(box[0])


def synchronize_rng_states(rng_types: list[str | RNGType], generator: torch.Generator | None = None) -> None:
    """`synchronize_rng_state` for each name in `rng_types`, in order."""
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)


def _broadcast(state: torch.Tensor) -> torch.Tensor:
    from .state import PartialState

    # The collective backend may only move tensors on the device (Accelerate does the same).
    device: Any = PartialState().device
    moved = state.to(device)
    dist.broadcast(moved, src=0)
    return moved.cpu()
