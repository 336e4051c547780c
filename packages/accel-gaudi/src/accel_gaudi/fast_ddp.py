"""fast_ddp: data parallelism without a DDP wrapper.

Parameters are broadcast from rank 0 once, at prepare time. After the backward that ends an
accumulation window, every gradient goes into one flat buffer, is scaled by 1/world and
all-reduced in a single asynchronous collective (as Gaudi's `all_reduce_gradients`; like it,
after the backward rather than overlapped with it), then copied back. One flag per parameter rides in the
same buffer, so a parameter that got a gradient on any rank gets the averaged one on every
rank, while one that got none anywhere keeps `grad=None` (as DDP leaves it).

Reducing twice in one step is harmless: an averaged gradient is the same on every rank, so
averaging it again changes nothing.

`FastDDPStrategy` is how the Accelerator uses it: a strategy of its own (entry point
`fast_ddp` in `accel.strategies`), chosen by Gaudi's `distribution_strategy="fast_ddp"`
option. Inside `no_sync` (and on accumulating micro-batches) it reduces nothing; the next
synchronising backward reduces the accumulated gradients.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from accel.strategies.base import Strategy

if TYPE_CHECKING:
    from accel.prepare.context import RunContext


@dataclass
class _Captured:
    """The flat buffer and the recorded pack and unpack of one fixed set of gradient tensors."""

    grads: list[torch.Tensor]
    buffer: torch.Tensor
    pack: Callable[[], Any]
    unpack: Callable[[], Any]


class FastDDP:
    """The models prepared with fast_ddp on this process, and their gradient reduction.

    With `capture` (the vendor's device-graph recorder: `capture(fn)` records `fn` once and returns its replay),
    the copy of every gradient into one persistent flat buffer and the copy back are recorded once and replayed
    each step, as Gaudi's `all_reduce_gradients(model, use_hpu_graphs=True)`; a recorded graph reads and writes
    the tensors it saw, so it is recorded again whenever the gradient tensors are not the same objects (after
    `zero_grad(set_to_none=True)`, which fast_ddp's own default avoids). A step where some gradient is missing
    goes through the eager path, whose flags keep DDP's `grad=None` semantics.
    """

    def __init__(
        self, dtype: torch.dtype, capture: Callable[[Callable[[], None]], Callable[[], Any]] | None = None
    ) -> None:
        self.dtype = dtype
        """Dtype of the flat buffer (bf16 on HPU, fp32 under emulation)."""
        self._models: list[weakref.ref[torch.nn.Module]] = []
        self._capture = capture
        self._captured: _Captured | None = None

    def register(self, model: torch.nn.Module) -> None:
        """Broadcast `model`'s parameters and buffers from rank 0 and reduce its gradients from now on."""
        with torch.no_grad():
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=0)
        self._models.append(weakref.ref(model))

    def __bool__(self) -> bool:
        return any(ref() is not None for ref in self._models)

    def _params(self) -> list[torch.nn.Parameter]:
        live = [m for m in (ref() for ref in self._models) if m is not None]
        self._models = [weakref.ref(m) for m in live]
        seen: set[int] = set()
        params = []
        for model in live:
            for p in model.parameters():
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
        return params

    def all_reduce_gradients(self) -> None:
        """Average every registered gradient over the processes with exactly one all-reduce."""
        params = self._params()
        if not params:
            return
        grads = [p.grad for p in params]
        if self._capture is not None and all(g is not None for g in grads):
            self._reduce_recorded(grads)  # type: ignore[arg-type]
            return
        self._reduce_eager(params)

    def _reduce_recorded(self, grads: list[torch.Tensor]) -> None:
        captured = self._captured
        if (
            captured is None
            or len(captured.grads) != len(grads)
            or any(a is not b for a, b in zip(captured.grads, grads))
        ):
            captured = self._captured = self._record(grads)
        captured.pack()
        dist.all_reduce(captured.buffer, async_op=True).wait()
        captured.unpack()

    def _record(self, grads: list[torch.Tensor]) -> _Captured:
        """Record packing (scaled by 1/world, in the buffer's dtype) and unpacking for these gradient tensors."""
        assert self._capture is not None
        buffer = torch.empty(sum(g.numel() for g in grads), dtype=self.dtype, device=grads[0].device)
        views = list(torch.split(buffer, [g.numel() for g in grads]))
        inverse = 1.0 / dist.get_world_size()

        def pack() -> None:
            with torch.no_grad():
                for grad, view in zip(grads, views):
                    view.copy_(grad.reshape(-1).to(self.dtype) * inverse)

        def unpack() -> None:
            with torch.no_grad():
                for grad, view in zip(grads, views):
                    grad.copy_(view.view_as(grad))

        return _Captured(grads=list(grads), buffer=buffer, pack=self._capture(pack), unpack=self._capture(unpack))

    def _reduce_eager(self, params: list[torch.nn.Parameter]) -> None:
        device = params[0].device
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).to(self.dtype) for p in params
        ]
        flags = torch.tensor([p.grad is not None for p in params], dtype=self.dtype, device=device)
        flat = torch.cat([*parts, flags])
        flat.mul_(1.0 / dist.get_world_size())
        # Asynchronous, as Gaudi's `all_reduce_gradients`: the host goes on queueing the unpacking
        # views; `wait` then orders the copies after the collective (on HCCL a stream wait, not
        # a host block). Like Gaudi's, the reduction runs after the backward, not during it.
        work = dist.all_reduce(flat, async_op=True)
        offset = 0
        reduced = []
        for p in params:
            reduced.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        missing = [i for i, p in enumerate(params) if p.grad is None]
        work.wait()
        # Reading the flags waits for the device: done only when this rank lacks a gradient.
        present = (flat[offset:] > 0).tolist() if missing else []
        with torch.no_grad():
            for p, grad in zip(params, reduced):
                if p.grad is not None:
                    p.grad.copy_(grad)
            for i in missing:
                if present[i]:
                    params[i].grad = reduced[i].to(params[i].dtype).clone()


@dataclass(kw_only=True, frozen=True)
class FastDDPConfig:
    """fast_ddp's settings; the Gaudi adapter fills `allreduce_dtype` (`strategy_defaults`)."""

    allreduce_dtype: torch.dtype | None = None
    """Dtype of the flat reduction buffer (None: the adapter's default, else fp32)."""
    capture: Callable[[Callable[[], None]], Callable[[], Any]] | None = None
    """Records the gradient packing and unpacking as device graphs (None: the adapter's default, else eager)."""


class FastDDPStrategy(Strategy):
    """Data parallelism without a wrapper: one flat all-reduce after the backward that syncs."""

    name: ClassVar[str] = "fast_ddp"
    needs_model_on_device: ClassVar[bool] = True
    keeps_gradients: ClassVar[bool] = True  # the recorded pack/unpack read the same gradient tensors every step

    def __init__(self, config: FastDDPConfig | None = None) -> None:
        super().__init__(config or FastDDPConfig())
        self._reducer: FastDDP | None = None
        self._paused = 0

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        if ctx.use_distributed and any(p.requires_grad for p in model.parameters()):
            if self._reducer is None:
                dtype = self.config.allreduce_dtype or ctx.adapter_defaults.get("allreduce_dtype") or torch.float32
                capture = self.config.capture or ctx.adapter_defaults.get("capture")
                self._reducer = FastDDP(dtype, capture)
            self._reducer.register(model)
        return model

    @contextlib.contextmanager
    def _pause(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self._pause()

    def after_backward(self, sync: bool) -> None:
        if sync and not self._paused and self._reducer is not None and self._reducer:
            self._reducer.all_reduce_gradients()
