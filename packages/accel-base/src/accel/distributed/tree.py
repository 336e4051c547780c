"""Pure helpers on nested structures of tensors (lists, tuples, dicts, namedtuples): no process
group, no global state, so anything may import them (precision, checkpoints, data loaders, ops)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch


def is_namedtuple(data: Any) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_fields")


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] | None = None,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """Apply `func(leaf, *args, **kwargs)` to every leaf of a nested structure that `test_type` accepts
    (default: tensors), keeping the structure (lists, tuples, namedtuples, mappings).

    Other leaves are returned as they are, or, with `error_on_other_type=True`, raise a TypeError
    (Accelerate's `recursively_apply`).
    """
    test = test_type or (lambda t: isinstance(t, torch.Tensor))

    def walk(node: Any) -> Any:
        if isinstance(node, (list, tuple)):
            items = [walk(d) for d in node]
            if is_namedtuple(node):
                return type(node)(*items)
            return type(node)(items)
        if isinstance(node, Mapping):
            return type(node)({k: walk(v) for k, v in node.items()})  # type: ignore[call-arg]
        if test(node):
            return func(node, *args, **kwargs)
        if error_on_other_type:
            raise TypeError(
                f"Unsupported types ({type(node)}) passed to `{getattr(func, '__name__', func)}`. Only nested "
                f"list/tuple/dicts of objects that are valid for `{getattr(test, '__name__', test)}` should be passed."
            )
        return node

    return walk(data)


def send_to_device(
    tensor: Any, device: Any, non_blocking: bool = False, skip_keys: str | list[str] | None = None
) -> Any:
    """Move every tensor (and object with `.to`) in `tensor`, a nest of lists/tuples/dicts, to `device`;
    tensors already there are untouched.

    `skip_keys`: a key or list of keys of the mappings in the nest whose values stay where they are
    (Accelerate's `send_to_device`).
    """
    skip = [skip_keys] if isinstance(skip_keys, str) else list(skip_keys or ())
    target = torch.device(device) if isinstance(device, str) else device

    def move(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            return t if t.device == target else t.to(target, non_blocking=non_blocking)
        if isinstance(t, (list, tuple)):
            items = [move(d) for d in t]
            return type(t)(*items) if is_namedtuple(t) else type(t)(items)
        if isinstance(t, Mapping):
            return type(t)({k: v if k in skip else move(v) for k, v in t.items()})  # type: ignore[call-arg]
        if hasattr(t, "to") and callable(t.to):
            try:
                return t.to(target, non_blocking=non_blocking)
            except TypeError:  # a `.to` without non_blocking
                return t.to(target)
        return t

    return move(tensor)


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
