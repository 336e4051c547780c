"""Where a model goes: Accelerate's rules for quantized and `device_map` models, and the check that a model
the walk did not move is on the device a strategy needs it on."""

from __future__ import annotations

import torch

from ..distributed.distributed_type import DistributedType
from .context import RunContext


def check_on_device(model: torch.nn.Module, ctx: RunContext) -> None:
    """A model left where it was (the adapter's `places_model` said no) must already be on the device when
    the strategy replicates it over processes (`Strategy.needs_model_on_device`): a model left on the host
    would fail later inside a collective with a much less helpful message.

    Raises:
        ValueError: a parameter is on another device type than `ctx.device`, saying what to call.
    """
    if ctx.evaluation_mode or not ctx.use_distributed or not ctx.strategy.needs_model_on_device:
        return
    stray = {p.device.type for p in model.parameters()} - {ctx.device.type}
    if stray:
        raise ValueError(
            f"In multi-process training the {ctx.adapter.name!r} adapter does not move models: this one has "
            f"parameters on {sorted(stray)}, not on {ctx.device}. Call `model.to(accelerator.device)` before "
            "`prepare`, or ask for the move with `prepare(..., device_placement=[True, ...])`."
        )


def check_device_map(
    model: torch.nn.Module, device_placement: bool, distributed_type: DistributedType, device: torch.device
) -> bool:
    """Accelerate's rules for quantized and `device_map` models; returns the placement to use."""
    device_map = getattr(model, "hf_device_map", None)
    quantized = getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    if quantized and device_map:
        devices = set(device_map.values())
        if len(devices) > 1 and distributed_type != DistributedType.NO:
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple devices in any "
                "distributed mode. In order to use 8-bit or 4-bit models that have been loaded across multiple devices "
                "the solution is to use Naive Pipeline Parallelism. Therefore you should not specify that you are "
                "under any distributed regime in your accel config."
            )
        if len(devices) == 1:
            only = next(iter(devices))
            if isinstance(only, int):
                only = torch.device(device.type, only)
            elif isinstance(only, str) and only not in ("cpu", "disk"):
                only = torch.device(only)
            if isinstance(only, torch.device) and (
                only.type != device.type or (only.index or 0) != (device.index or 0)
            ):
                raise ValueError(
                    "You can't train a model that has been loaded in 8-bit or 4-bit precision on a different device than "
                    f"the one you're training on ({device}). Make sure you loaded the model on the correct device using "
                    "for example `device_map={'': accelerator.device}`."
                )
        if "cpu" in devices or "disk" in devices:
            raise ValueError(
                "You can't train a model that has been loaded in 8-bit or 4-bit precision with CPU or disk offload. "
                "Load it entirely on the accelerator, or train it unquantized."
            )
        return False
    if verify_device_map(model):
        if distributed_type != DistributedType.NO:
            raise ValueError(
                "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode. "
                "Please rerun your script specifying `--num-processes 1` or by launching with `python {myscript.py}`."
            )
        return False
    return device_placement


def verify_device_map(model: torch.nn.Module) -> bool:
    return any(len(getattr(m, "hf_device_map", None) or {}) > 1 for m in model.modules())
