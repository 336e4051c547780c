"""What `prepare` produced, and what strategies and checkpoints may know about the run.

Strategies and `accel.checkpoint` receive these two objects, never the `Accelerator`:

- `Prepared`, the registry of every prepared object in the order it was prepared (models,
  optimizers, schedulers, data loaders), the objects registered for checkpointing, the
  grad scaler and the `save_state`/`load_state` hooks. A strategy whose engine replaces
  a model (DeepSpeed) does so here, with `replace_model`.
- `RunContext`, a frozen record of the run built when a hook is called: devices, ranks,
  precision, accumulation steps, the adapter and the strategy. A strategy that must change
  a setting says so through its own hooks (`Strategy.accumulation_steps`), not by writing
  into the Accelerator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..adapter.base import Adapter
    from ..settings.kwargs import TorchDynamoPlugin
    from ..strategies.base import Strategy


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


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """The run as strategies and checkpoints see it (read-only, built for each call)."""

    device: torch.device
    process_index: int
    local_process_index: int
    num_processes: int
    is_main_process: bool
    is_local_main_process: bool
    use_distributed: bool
    mixed_precision: str
    gradient_accumulation_steps: int
    save_on_each_node: bool
    """Whether the local main process of every node writes checkpoints (not only rank 0)."""
    split_batches: bool = False
    """Whether each batch of a prepared loader is split over the processes."""
    adapter: Adapter
    strategy: Strategy
    adapter_defaults: dict[str, Any] = field(default_factory=dict)
    """The adapter's defaults for this strategy (`Adapter.strategy_defaults`), lowest precedence."""
    dynamo_plugin: TorchDynamoPlugin | None = None
    """The run's torch.compile settings, for a strategy that compiles its own engine (`compiles_model`)."""
    save_model_kwargs: dict[str, Any] = field(default_factory=dict)
    """In `save_checkpoint_state`: the keyword arguments the user gave `save_state` (Accelerate's
    `save_model_func_kwargs`), for a strategy whose engine saves itself (`Strategy.takes_save_kwargs`)."""
