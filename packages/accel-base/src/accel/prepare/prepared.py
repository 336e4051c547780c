"""What `prepare` produced, and what strategies and checkpoints may know about the run.

Strategies and `accel.checkpoint` receive these two objects, never the `Accelerator`:

- `Prepared`, the registry of every prepared object in the order it was prepared (models,
  optimizers, schedulers, data loaders), the objects registered for checkpointing, the
  grad scaler and the `save_state`/`load_state` hooks. A strategy whose engine replaces
  a model (DeepSpeed) does so here, with `replace_model`.
- `RunContext` (`accel.prepare.context`, re-exported here), a frozen record of the run built
  when a hook is called: devices, ranks, precision, accumulation steps, the adapter and the
  strategy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .context import RunContext

__all__ = ["Prepared", "RunContext"]


@dataclass(eq=False)
class Prepared:
    """Every object `prepare` returned, by kind, in the order prepared (one per Accelerator)."""

    models: list[torch.nn.Module] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)
    """`AcceleratedOptimizer`s; `.optimizer` is the (possibly replaced) optimizer inside."""
    schedulers: list[Any] = field(default_factory=list)
    dataloaders: list[Any] = field(default_factory=list)
    custom_objects: list[Any] = field(default_factory=list)
    """Objects given to `register_for_checkpointing`."""
    scaler: Any = None
    """The fp16 grad scaler (None without one)."""
    save_state_pre_hooks: dict[int, Callable[..., Any]] = field(default_factory=dict)
    load_state_pre_hooks: dict[int, Callable[..., Any]] = field(default_factory=dict)

    def replace_model(self, old: torch.nn.Module, new: torch.nn.Module) -> None:
        """Put `new` where `old` was (an engine that wraps a prepared model)."""
        self.models[next(i for i, m in enumerate(self.models) if m is old)] = new

    def clear(self) -> None:
        """Forget every prepared model, optimizer, scheduler and loader (`free_memory`)."""
        for objects in (self.models, self.optimizers, self.schedulers, self.dataloaders):
            objects.clear()
