"""xla_ddp: data parallelism on XLA devices the way torch_xla does it, without a DDP wrapper.

Replicas start from replica 0's weights (`xm.broadcast_master_param`, at prepare time).
After the backward that closes an accumulation window (not inside `no_sync`), the prepared
models' gradients are averaged by one XLA all-reduce traced into the step's graph, so `.grad`
reads as under DDP and clipping sees the averaged gradients; the optimizer step then does not
reduce again. When nothing averaged them (a bare `loss.backward()`), the strategy averages them
right before the step (`before_optimizer_step`, through `xm.reduce_gradients`, the reducing half
of `xm.optimizer_step`).

The name says what it replaces: it is what "ddp" means to a user (every process a full
replica, gradients averaged), done the XLA way, as `fast_ddp` is Gaudi's. Every torch_xla call
goes through the vendor module the xla adapter hands over (`XLAAdapter.strategy_defaults`),
so emulation swaps it like every other torch_xla call.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.strategies.base import Strategy

if TYPE_CHECKING:
    from accel.prepare.context import RunContext


class XLADataParallelStrategy(Strategy):
    """Every process a full replica; gradients averaged by one XLA all-reduce per optimizer step."""

    name: ClassVar[str] = "xla_ddp"

    def __init__(self, config: Any = None) -> None:
        if config:
            raise ValueError(
                f"The xla_ddp strategy takes no settings, got {config!r}. Drop the strategy config "
                "(strategy_config=, ACCEL_STRATEGY_CONFIG or --strategy-kwargs)."
            )
        super().__init__(None)
        self._vendor: Any = None
        self._models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._paused = 0
        self._sync = True
        self._reduced = False

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """No wrapper: with several processes, broadcast replica 0's weights and average this model's
        gradients from now on.

        Raises:
            ValueError: the adapter did not hand over its torch_xla module (only the xla adapter does).
        """
        if not ctx.use_distributed:
            return model
        vendor = ctx.adapter_defaults.get("vendor")
        if vendor is None:
            raise ValueError(
                "The xla_ddp strategy runs on the xla adapter only (it reaches torch_xla through the adapter's "
                "vendor module, `strategy_defaults('xla_ddp')['vendor']`). Use `adapter='xla'`, or the 'ddp' strategy."
            )
        self._vendor = vendor
        vendor.broadcast_master_params(model)
        self._models.add(model)
        return model

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Average nothing inside (`Accelerator.no_sync`, accumulating micro-batches of `accumulate`)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def after_backward(self, sync: bool) -> None:
        # Averaging is linear: gradients added after an average and averaged again come out as
        # the average of everything, so a reduction too many costs time, never correctness.
        self._sync = sync
        self._reduced = False
        if sync and not self._paused and len(self._models):
            self._reduce(p for model in self._models for p in model.parameters())

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        """Clip by the norm of the replica-averaged gradients, averaging them here if backward did not."""
        if self._vendor is None:
            return None  # one process: nothing to average, the adapter clips
        if self._sync and not self._paused and not self._reduced:
            self._reduce(parameters)
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Average this step's gradients unless backward or clipping did (a bare `loss.backward()`): the core
        calls it before every real step of a prepared optimizer; the next step starts unreduced."""
        needed, self._reduced = not self._reduced, False
        if needed and self._vendor is not None:
            self._vendor.reduce_gradients(optimizer)

    def _reduce(self, params: Iterable[torch.Tensor]) -> None:
        grads = {id(p): p.grad for p in params if p.grad is not None}
        self._vendor.all_reduce_mean(list(grads.values()))
        self._reduced = True
