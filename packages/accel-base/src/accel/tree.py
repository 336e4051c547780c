"""Pure helpers on nested structures of tensors (lists, tuples, dicts, namedtuples): no process
group, no global state, so anything may import them (precision, checkpoints, data loaders, ops)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def is_namedtuple(data: Any) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_fields")


def recursively_apply(
    func: Callable[[torch.Tensor], Any], data: Any, *, test_type: Callable[[Any], bool] | None = None
) -> Any:
    """Apply `func` to every tensor in a nested structure; other leaves are returned as they are."""
    test = test_type or (lambda t: isinstance(t, torch.Tensor))
    if isinstance(data, (list, tuple)):
        items = [recursively_apply(func, d, test_type=test_type) for d in data]
        if is_namedtuple(data):
            return type(data)(*items)
        return type(data)(items)
    if isinstance(data, Mapping):
        return type(data)({k: recursively_apply(func, v, test_type=test_type) for k, v in data.items()})  # type: ignore[call-arg]
    if test(data):
        return func(data)
    return data


def send_to_device(data: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Move every tensor (and object with `.to`) in `data` to `device`; tensors already there are untouched."""

    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.device == device:
            return t
        return t.to(device, non_blocking=non_blocking)

    return recursively_apply(move, data, test_type=lambda t: hasattr(t, "to") and callable(t.to))


def tensors_in(data: Any) -> list[torch.Tensor]:
    """Every tensor in `data`, in traversal order."""
    found: list[torch.Tensor] = []
    recursively_apply(lambda t: found.append(t), data)
    return found


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of identically structured nests of tensors."""
    first = data[0]
    if isinstance(first, (list, tuple)):
        items = [concatenate([d[i] for d in data], dim=dim) for i in range(len(first))]
        return type(first)(*items) if is_namedtuple(first) else type(first)(items)
    if isinstance(first, Mapping):
        return type(first)({k: concatenate([d[k] for d in data], dim=dim) for k in first})  # type: ignore[call-arg]
    if not isinstance(first, torch.Tensor):
        raise TypeError(f"Can only concatenate tensors, got {type(first).__name__}.")
    return torch.cat(data, dim=dim)


def find_batch_size(data: Any) -> int | None:
    """Size of dim 0 of the first tensor found in `data`."""
    tensors = tensors_in(data)
    for t in tensors:
        if t.ndim > 0:
            return int(t.shape[0])
    return None
