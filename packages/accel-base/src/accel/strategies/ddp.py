"""DistributedDataParallel, with its kwargs and communication hooks."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..settings.kwargs import DDPCommunicationHookType, DistributedDataParallelKwargs
from .base import Strategy

if TYPE_CHECKING:
    from ..prepare.context import RunContext


class DDPStrategy(Strategy):
    """Data parallelism through `torch.nn.parallel.DistributedDataParallel`.

    With one process, or a model without trainable parameters, the model is returned
    unwrapped: DDP would only add overhead.
    """

    name: ClassVar[str] = "ddp"
    needs_model_on_device: ClassVar[bool] = True

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        if not ctx.use_distributed or isinstance(model, DDP):
            return model
        if not any(p.requires_grad for p in model.parameters()):
            return model
        kwargs: DistributedDataParallelKwargs = ctx.ddp_kwargs or DistributedDataParallelKwargs()
        wrapped = DDP(model, device_ids=ctx.ddp_device_ids, **kwargs.ddp_kwargs())
        register_comm_hook(wrapped, kwargs)
        return wrapped

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.module if isinstance(model, DDP) else model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return isinstance(model, DDP)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DDP):
            return model.no_sync()
        return contextlib.nullcontext()


def register_comm_hook(model: DDP, kwargs: DistributedDataParallelKwargs) -> None:
    """Register the gradient compression / PowerSGD hook the kwargs ask for."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hook_type = DDPCommunicationHookType(kwargs.comm_hook)
    wrapper_type = DDPCommunicationHookType(kwargs.comm_wrapper)
    if hook_type is DDPCommunicationHookType.NO:
        return
    compress: dict[DDPCommunicationHookType, Any] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
    }
    wrappers: dict[DDPCommunicationHookType, Any] = {
        DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
        DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
    }
    if hook_type in compress:
        model.register_comm_hook(state=None, hook=compress[hook_type])
        return
    hook = (
        powerSGD_hook.powerSGD_hook
        if hook_type is DDPCommunicationHookType.POWER_SGD
        else powerSGD_hook.batched_powerSGD_hook
    )
    if wrapper_type in wrappers:
        hook = wrappers[wrapper_type](hook)
    state = powerSGD_hook.PowerSGDState(process_group=None, **kwargs.comm_state_option)
    model.register_comm_hook(state=state, hook=hook)
