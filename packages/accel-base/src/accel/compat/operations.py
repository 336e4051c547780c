"""The rest of Accelerate's `utils.operations`: nested-structure helpers and collectives.

The collectives themselves live in `accel.distributed.ops`; this module adds the names scripts import
from `accelerate.utils` on top of them (all re-exported by `accel.utils`). `reduce` here is the engine's
with Accelerate's module-level default, `reduction="mean"` (`Accelerator.reduce` keeps "sum").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..distributed import ops
from ..distributed.ops import CannotPadNestedTensorWarning, is_namedtuple, pad_across_processes, recursively_apply
from ..errors import CollectiveMismatchError

DistributedOperationException = CollectiveMismatchError
"""Accelerate's name for the error a collective raises in debug mode when ranks disagree."""


@dataclass
class TensorInformation:
    """Shape and dtype of a tensor, without its data (`get_data_structure`)."""

    shape: torch.Size
    dtype: torch.dtype


def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_tensor_information(tensor_info: Any) -> bool:
    return isinstance(tensor_info, TensorInformation)


def honor_type(obj: Any, generator: Any) -> Any:
    """Build an object of `obj`'s type (tuple, list, namedtuple) from `generator`."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def get_data_structure(data: Any) -> Any:
    """The same nesting with each tensor replaced by its `TensorInformation`."""
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure: Any) -> Any:
    """Empty tensors shaped as a `get_data_structure` result describes."""
    return recursively_apply(
        lambda info: torch.empty(info.shape, dtype=info.dtype), data_structure, test_type=is_tensor_information
    )


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, returning None instead of raising on data without tensors."""
    try:
        return ops.find_batch_size(data)
    except (ValueError, TypeError):
        return None


def listify(data: Any) -> Any:
    """The same nesting with every tensor turned into (nested) Python lists/numbers."""

    def _convert(t: torch.Tensor) -> Any:
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.to(torch.float32)
        return t.tolist()

    return recursively_apply(_convert, data)


def slice_tensors(
    data: Any, tensor_slice: slice, process_index: int | None = None, num_processes: int | None = None
) -> Any:
    """Slice every tensor of a nested structure with `tensor_slice`."""
    return recursively_apply(lambda t: t[tensor_slice], data)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor found in a nested structure (None if there is none)."""
    if isinstance(data, Mapping):
        values: Any = data.values()
    elif isinstance(data, (tuple, list)):
        values = data
    elif isinstance(data, torch.Tensor):
        return data.device
    else:
        return None
    for value in values:
        device = find_device(value)
        if device is not None:
            return device
    return None


def convert_to_fp32(tensor: Any) -> Any:
    """Every fp16/bf16 tensor of a nested structure, as float32."""
    return recursively_apply(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, tensor)


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0, *, group: Any = None) -> Any:
    """`accel.distributed.ops.reduce` with Accelerate's default reduction, "mean"."""
    return ops.reduce(tensor, reduction, scale, group=group)


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Rank 0's tensor on every process; the others pass None (they need not know its shape)."""
    from ..distributed.state import PartialState

    state = PartialState()
    box = [(tuple(tensor.shape), tensor.dtype) if tensor is not None else None]
    info = ops.broadcast_object_list(box)[0] if state.use_distributed else box[0]
    if info is None:
        raise ValueError("copy_tensor_to_devices needs the tensor on the main process (the others pass None).")
    if tensor is None:
        tensor = torch.zeros(info[0], dtype=info[1], device=state.device)
    return ops.broadcast(tensor.to(state.device).contiguous())


def pad_input_tensors(tensor: Any, batch_size: int, num_processes: int, dim: int = 0) -> Any:
    """Pad a batch along `dim` (repeating its last sample) so it splits evenly over `num_processes`."""

    def _pad(t: torch.Tensor) -> torch.Tensor:
        remainder = batch_size % num_processes
        if remainder == 0 or t.shape[dim] != batch_size:
            return t
        extra = num_processes - remainder
        last = t.narrow(dim, t.shape[dim] - 1, 1)
        return torch.cat([t, *([last] * extra)], dim=dim)

    return recursively_apply(_pad, tensor)


__all__ = [
    "CannotPadNestedTensorWarning",
    "DistributedOperationException",
    "TensorInformation",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "find_device",
    "get_data_structure",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_tensor_information",
    "is_torch_tensor",
    "listify",
    "pad_across_processes",
    "pad_input_tensors",
    "reduce",
    "slice_tensors",
]
