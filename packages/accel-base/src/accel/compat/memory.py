"""Memory helpers: retry with a smaller batch size on out-of-memory, and release objects."""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

# Messages of out-of-memory errors across PyTorch backends (the allocator names differ).
_OOM_MESSAGES = (
    " out of memory",
    "can't allocate memory",
    "Allocation failed",
    "CUDNN_STATUS_NOT_SUPPORTED",
)


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Release cached device memory through the adapter in use (after a `gc.collect()` if asked)."""
    if garbage_collection:
        gc.collect()
    from ..distributed.state import PartialState, partial_state_exists

    if partial_state_exists():
        PartialState().adapter.empty_cache()


def release_memory(*objects: Any) -> list[Any]:
    """Drop the references in `objects` and free device memory; returns a list of Nones to assign back.

    model, optimizer = release_memory(model, optimizer)
    """
    released = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return released


def should_reduce_batch_size(exception: BaseException) -> bool:
    """Whether `exception` is an out-of-memory error (a smaller batch may fit)."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(message in str(exception.args[0]) for message in _OOM_MESSAGES)
    return False


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call `function(batch_size, ...)`, retrying with a smaller batch size after out-of-memory.

    The batch size starts at `starting_batch_size` and is multiplied by 0.9 after each
    out-of-memory error (or set by `reduce_batch_size_fn()`). Call the decorated function
    without the batch size.

    Raises:
        TypeError: the batch size was passed when calling the decorated function.
        RuntimeError: the batch size reached zero.
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def shrink() -> int:
        nonlocal batch_size
        batch_size = reduce_batch_size_fn() if reduce_batch_size_fn is not None else int(batch_size * 0.9)
        return batch_size

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            given = ", ".join(f"{name}={value}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. "
                f"Remove it, the decorator passes it: `{function.__name__}({given})`"
            )
        while True:
            if batch_size == 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as e:
                if not should_reduce_batch_size(e):
                    raise
                clear_device_cache(garbage_collection=True)
                shrink()

    return decorator


__all__ = ["clear_device_cache", "find_executable_batch_size", "release_memory", "should_reduce_batch_size"]
