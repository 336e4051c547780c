"""Collective operations on tensors and nested structures of tensors.

Every function accepts a tensor or any nesting of lists, tuples, dicts and namedtuples
of tensors and returns the same structure. With one process they return their input
(gather, reduce with "sum") without a collective. In debug mode (`ACCEL_DEBUG_MODE=1`)
each collective is first checked across ranks (`accel.debug`): a different operation,
shape, dtype or number of calls raises `CollectiveMismatchError` naming each rank's shape,
dtype and call site, instead of hanging or returning wrong numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from .debug import check_collective
from .state import PartialState


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


def _world(group: Any = None) -> tuple[bool, int]:
    state = PartialState()
    if group is not None and state.use_distributed:
        return True, dist.get_world_size(group)
    return state.use_distributed, state.num_processes


def _debug() -> bool:
    # Every collective asks: one dict lookup, not a `PartialState()` view nor an import statement.
    return bool(PartialState._shared_state.get("debug", False))


def verify_operation(name: str, data: Any, group: Any = None, *, pad: bool = False) -> None:
    """Debug mode: raise `CollectiveMismatchError` unless every rank calls `name` now with tensors of the same
    shapes and dtypes (with `pad`, the same number of dimensions). See `accel.debug`."""
    check_collective(name, _tensors(data), group, pad=pad)


def _require_tensors(name: str, data: Any) -> None:
    leaves: list[Any] = []
    recursively_apply(leaves.append, data, test_type=lambda _: True)
    bad = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
    if bad:
        raise TypeError(
            f"Unsupported types ({', '.join(bad)}) passed to `{name}`. Only nested lists/tuples/dicts of tensors "
            "can be gathered; use `gather_object` (or `gather_for_metrics(..., use_gather_object=True)`) for other objects."
        )


def _tensors(data: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    recursively_apply(lambda t: found.append(t), data)
    return found


# torch 2.13 renamed all_gather_into_tensor; older releases (pinned by some vendor stacks) lack the new name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def gather(tensor: Any, group: Any = None) -> Any:
    """Concatenate each tensor across processes along dim 0 (scalars become a 1-D tensor).

    `group`: gather over this process group only (default: every process).
    """
    distributed, world = _world(group)
    if not distributed:
        return tensor
    if _debug():
        verify_operation("gather", tensor, group)
    _require_tensors("gather", tensor)
    return recursively_apply(lambda t: _all_gather(t, world, group), tensor)


def _all_gather(t: torch.Tensor, world: int, group: Any = None) -> torch.Tensor:
    if t.ndim == 0:
        t = t.clone()[None]
    t = t.contiguous()
    out = torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    _all_gather_single(out, t, group=group)
    return out


def gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Gather picklable objects from every process (or `group`); returns one flat list (rank order)."""
    distributed, world = _world(group)
    if not distributed:
        return list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if _debug():
        verify_operation("gather_object", None, group)
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    flat: list[Any] = []
    for item in out:
        flat.extend(item if isinstance(item, (list, tuple)) else [item])
    return flat


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Every process receives `from_process`'s values, in place and returned."""
    distributed, _ = _world()
    if not distributed:
        return tensor
    if _debug():
        verify_operation("broadcast", tensor)

    def _bcast(t: torch.Tensor) -> torch.Tensor:
        dist.broadcast(t, src=from_process)
        return t

    return recursively_apply(_bcast, tensor)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Broadcast a list of picklable objects in place from `from_process`."""
    distributed, _ = _world()
    if distributed:
        if _debug():
            check_collective("broadcast_object_list", [], count=len(object_list))
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def reduce(tensor: Any, reduction: str = "sum", scale: float = 1.0, group: Any = None) -> Any:
    """All-reduce each tensor: "sum", "mean" or "none"; the result is multiplied by `scale`.

    `group`: reduce over this process group only (default: every process).
    Returns new tensors; the inputs are not modified.
    """
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}.")
    distributed, world = _world(group)
    if distributed and _debug():
        verify_operation("reduce", tensor, group)

    def _reduce(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if distributed and reduction != "none":
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        if reduction == "mean" and distributed:
            out /= world
        if scale != 1.0:
            out *= scale
        return out

    return recursively_apply(_reduce, tensor)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along `dim` to the largest size any process has, with `pad_index`."""
    distributed, world = _world()
    if not distributed:
        return tensor
    if _debug():
        verify_operation("pad_across_processes", tensor, pad=True)

    def _pad(t: torch.Tensor) -> torch.Tensor:
        if dim >= t.ndim or dim < -t.ndim:
            return t
        d = dim % t.ndim
        size = torch.tensor([t.shape[d]], device=t.device, dtype=torch.int64)
        sizes = _all_gather(size, world)
        target = int(sizes.max())
        if target == t.shape[d]:
            return t
        new_shape = list(t.shape)
        new_shape[d] = target
        out = t.new_full(new_shape, pad_index)
        index = [slice(None)] * t.ndim
        index[d] = slice(target - t.shape[d], target) if pad_first else slice(0, t.shape[d])
        out[tuple(index)] = t
        return out

    return recursively_apply(_pad, tensor)


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
    tensors = _tensors(data)
    for t in tensors:
        if t.ndim > 0:
            return int(t.shape[0])
    return None
