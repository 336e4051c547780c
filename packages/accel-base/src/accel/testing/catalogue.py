"""The error catalogue: each bad input the core validates, the error type and the message users see.

Every adapter must let these through unchanged: an adapter that swallows one, or turns it
into another type or a vaguer message, fails the kit. The workers run each trigger on
every rank (so the distributed-only rules apply) and report what was raised; the suite
compares with `error` and `match` here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..accelerator import Accelerator
from ..adapter.base import PRECISIONS
from ..adapter.registry import select_adapter
from ..distributed.state import PartialState
from ..errors import AdapterNotFoundError, CheckpointError
from ..settings.kwargs import DistributedDataParallelKwargs, GradientAccumulationPlugin
from ..strategies.fsdp import FSDPConfig
from .problems import LR, build_model


@dataclass(frozen=True)
class ErrorCase:
    """One bad input: how to trigger it, and what must be raised."""

    name: str
    error: type[BaseException]
    match: str
    """A regular expression the message must contain (`re.search`)."""
    trigger: Callable[[Path], Any]
    needs: str = ""
    """"distributed" (only meaningful with several processes), "fsdp2" (only if the adapter
    applies it), "unclaimed-precision" (only if the adapter leaves some precision out)."""


def _model_and_opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model()
    return model, torch.optim.SGD(model.parameters(), lr=LR)


def _unclaimed_precision() -> str:
    # From the process state, not an Accelerator: building one would fix the precision first.
    caps = PartialState().adapter.capabilities
    return next(p for p in PRECISIONS if p not in caps.precisions)


def _device_map_model() -> torch.nn.Module:
    model = build_model()
    model.hf_device_map = {"0": 0, "2": 1}  # type: ignore[assignment]
    return model


CASES: list[ErrorCase] = [
    ErrorCase(
        "unknown_precision",
        ValueError,
        r"mixed_precision must be one of 'no', 'bf16', 'fp16', 'fp8', got 'fp32'",
        lambda _: Accelerator(mixed_precision="fp32"),
    ),
    ErrorCase(
        "unclaimed_precision",
        ValueError,
        r"adapter does not support mixed_precision='\w+'; it supports \[",
        lambda _: Accelerator(mixed_precision=_unclaimed_precision()),
        needs="unclaimed-precision",
    ),
    ErrorCase(
        "device_placement_length",
        ValueError,
        r"`device_placement` should be a list with 2 elements",
        lambda _: Accelerator().prepare(*_model_and_opt(), device_placement=[True]),
    ),
    ErrorCase(
        "accumulation_steps_zero",
        ValueError,
        r"`gradient_accumulation_steps` must be an int >= 1, got 0",
        lambda _: Accelerator(gradient_accumulation_steps=0),
    ),
    ErrorCase(
        "accumulation_given_twice",
        ValueError,
        r"You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`",
        lambda _: Accelerator(
            gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2)
        ),
    ),
    ErrorCase(
        "kwargs_handler_twice",
        ValueError,
        r"You can only pass one DistributedDataParallelKwargs in `kwargs_handlers`",
        lambda _: Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()]),
    ),
    ErrorCase(
        "two_strategy_plugins",
        ValueError,
        r"Pass at most one of fsdp_plugin, deepspeed_plugin, megatron_lm_plugin",
        lambda _: Accelerator(fsdp_plugin=FSDPConfig(), megatron_lm_plugin=object()),
    ),
    ErrorCase(
        "device_map_in_distributed_mode",
        ValueError,
        r"You can't train a model that has been loaded with `device_map='auto'` in any distributed mode",
        lambda _: Accelerator().prepare(_device_map_model()),
        needs="distributed",
    ),
    ErrorCase(
        "fsdp2_model_without_optimizer",
        ValueError,
        r"When using FSDP2, a model and optimizer must be passed together",
        lambda _: Accelerator(strategy="fsdp2").prepare(build_model()),
        needs="fsdp2",
    ),
    ErrorCase(
        "unknown_adapter",
        AdapterNotFoundError,
        r"No accel adapter named 'no-such-adapter' is installed\. Installed adapters: .*cpu",
        lambda _: select_adapter("no-such-adapter"),
    ),
    ErrorCase(
        "gather_non_tensor",
        TypeError,
        r"use `gather_object`",
        lambda _: Accelerator().gather("not a tensor"),
        needs="distributed",  # one process returns its input as is, as Accelerate does
    ),
    ErrorCase(
        "save_state_without_directory",
        ValueError,
        r"save_state needs `output_dir`",
        lambda _: Accelerator().save_state(),
    ),
    ErrorCase(
        "load_state_missing_directory",
        CheckpointError,
        r"No checkpoint at .*missing-checkpoint: the directory does not exist",
        lambda out: Accelerator().load_state(out / "missing-checkpoint"),
    ),
    ErrorCase(
        "skip_first_batches_unprepared",
        TypeError,
        r"skip_first_batches needs a data loader returned by `Accelerator.prepare`",
        lambda _: Accelerator().skip_first_batches(DataLoader(TensorDataset(torch.arange(4))), 1),  # type: ignore[arg-type]
    ),
    ErrorCase(
        "register_without_state_dict",
        ValueError,
        r"All `objects` must include a `state_dict` and `load_state_dict` function",
        lambda _: Accelerator().register_for_checkpointing(object()),
    ),
]


def run_case(case: ErrorCase, out: Path) -> dict[str, Any]:
    """Trigger `case` and report what was raised (type name, message), or that nothing was."""
    try:
        case.trigger(out)
    except Exception as exc:
        return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    return {"type": "", "mro": [], "message": "nothing was raised"}


def matches(case: ErrorCase, report: dict[str, Any]) -> bool:
    return case.error.__name__ in report["mro"] and re.search(case.match, report["message"]) is not None
