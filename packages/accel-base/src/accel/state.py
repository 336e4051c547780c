"""Accelerate's `state` module path: `PartialState`, `AcceleratorState` and `GradientState` (in
`accel.distributed.state`)."""

from .distributed.distributed_type import DistributedType
from .distributed.state import AcceleratorState, GradientState, PartialState, is_initialized

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]
