"""Mixed precision around a model's forward: autocast in, fp32 out.

The forward runs under the adapter's autocast; floating outputs in half precision are
converted back to fp32 so losses and metrics computed outside the model stay in fp32.
The original forward is kept as `model._original_forward` and restored by
`unwrap_model(keep_fp32_wrapper=False)`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

from .tree import recursively_apply


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def convert_outputs_to_fp32(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `forward` so its half-precision floating outputs come back as fp32."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return recursively_apply(_to_fp32, forward(*args, **kwargs))

    wrapped.__wrapped_fp32__ = True  # type: ignore[attr-defined]
    return wrapped


def wrap_forward_in_autocast(
    model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager[Any]]
) -> None:
    """Run `model.forward` under a fresh `autocast()` context and return fp32 outputs.

    Keeps the original as `model._original_forward`.
    """
    if getattr(model.forward, "__wrapped_fp32__", False):
        return
    original = model.forward
    model._original_forward = original  # type: ignore[assignment]
    autocast_forward = _autocast_decorator(autocast)(original)
    model.forward = convert_outputs_to_fp32(autocast_forward)  # type: ignore[method-assign]


def _autocast_decorator(
    make_ctx: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            # A fresh context per call: an autocast object keeps its previous state on
            # itself, so sharing one breaks under re-entrant forwards.
            with make_ctx():
                return fn(*args, **kwargs)

        return inner

    return decorate


def remove_autocast_wrapper(model: torch.nn.Module) -> None:
    """Undo `wrap_forward_in_autocast`."""
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        model.forward = original  # type: ignore[method-assign]
