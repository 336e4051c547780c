"""Collective operations on tensors and nested structures of tensors.

Every function accepts a tensor or any nesting of lists, tuples, dicts and namedtuples
of tensors and returns the same structure. With one process they return their input
(gather, reduce with "sum") without a collective. In debug mode (`ACCEL_DEBUG_MODE=1`)
each collective is first checked across ranks (`accel.distributed.debug`): a different operation,
shape, dtype or number of calls raises `CollectiveMismatchError` naming each rank's shape,
dtype and call site, instead of hanging or returning wrong numbers.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from .debug import check_collective
from .state import PartialState
from .tree import concatenate, find_batch_size, is_namedtuple, recursively_apply, send_to_device
from .tree import tensors_in as _tensors
from .watchdog import watched

__all__ = [
    "REDUCTIONS",
    "CannotPadNestedTensorWarning",
    "broadcast",
    "broadcast_object_list",
    "concatenate",
    "find_batch_size",
    "gather",
    "gather_object",
    "is_namedtuple",
    "pad_across_processes",
    "recursively_apply",
    "reduce",
    "send_to_device",
    "verify_operation",
]


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
    shapes and dtypes (with `pad`, the same number of dimensions). See `accel.distributed.debug`."""
    state = PartialState()
    check_collective(
        name, _tensors(data), group, timeout_s=state.timeout.total_seconds(), device_type=state.device.type, pad=pad
    )


def _require_tensors(name: str, data: Any) -> None:
    leaves: list[Any] = []
    recursively_apply(leaves.append, data, test_type=lambda _: True)
    bad = sorted({type(leaf).__name__ for leaf in leaves if not isinstance(leaf, torch.Tensor)})
    if bad:
        raise TypeError(
            f"Unsupported types ({', '.join(bad)}) passed to `{name}`. Only nested lists/tuples/dicts of tensors "
            "can be gathered; use `gather_object` (or `gather_for_metrics(..., use_gather_object=True)`) for other objects."
        )


# torch 2.13 renamed all_gather_into_tensor; older releases (pinned by some vendor stacks) lack the new name.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@watched("gather", group_at=1)
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
    # Not differentiable (as in Accelerate): gather the values, not the autograd graph, so a tensor that
    # requires grad gathers like any other instead of failing on the collective's in-place output.
    t = t.detach()
    if t.ndim == 0:
        t = t.clone()[None]
    t = t.contiguous()
    out = torch.empty((world * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    _all_gather_single(out, t, group=group)
    return out


@watched("gather_object", group_at=1)
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


@watched("broadcast")
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


@watched("broadcast_object_list")
def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """Broadcast a list of picklable objects in place from `from_process`."""
    distributed, _ = _world()
    if distributed:
        if _debug():
            state = PartialState()
            check_collective(
                "broadcast_object_list",
                [],
                timeout_s=state.timeout.total_seconds(),
                device_type=state.device.type,
                count=len(object_list),
            )
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


REDUCTIONS = ("mean", "sum", "max", "min", "none")
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


@watched("reduce", group_at=3)
def reduce(tensor: Any, reduction: str = "sum", scale: float = 1.0, group: Any = None) -> Any:
    """All-reduce each tensor: "sum" (default), "mean", "max", "min" or "none"; the result is multiplied by `scale`.

    `group`: reduce over this process group only (default: every process). "none" reduces nothing but is
    still checked across ranks in debug mode. Returns new tensors; the inputs are not modified.
    `accel.utils.reduce` is this with Accelerate's default, "mean".

    Raises:
        ValueError: a reduction not in `REDUCTIONS`.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum', 'max', 'min' or 'none', got {reduction!r}.")
    distributed, world = _world(group)
    if distributed and _debug():
        verify_operation("reduce", tensor, group)
    op = _REDUCE_OPS.get(reduction)

    def _reduce(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if distributed and op is not None:
            dist.all_reduce(out, op=op, group=group)
        if reduction == "mean" and distributed:
            out /= world
        # Out of place: an integer tensor scaled by a float comes back as a float tensor.
        return out * scale if scale != 1.0 else out

    return recursively_apply(_reduce, tensor)


class CannotPadNestedTensorWarning(UserWarning):
    """`pad_across_processes` met a nested tensor, which it leaves as is."""


@watched("pad_across_processes")
def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along `dim` to the largest size any process has, with `pad_index` (at the end, or at
    the start with `pad_first`). A tensor with fewer than `dim` dimensions is returned as is; so is a nested
    tensor, with a `CannotPadNestedTensorWarning`."""
    if isinstance(tensor, torch.Tensor) and tensor.is_nested:
        warnings.warn(
            "pad_across_processes cannot pad a nested tensor; it is returned unchanged.",
            CannotPadNestedTensorWarning,
            stacklevel=2,
        )
        return tensor
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
