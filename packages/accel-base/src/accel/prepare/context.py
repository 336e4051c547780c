"""What `Accelerator.prepare` hands to the adapter and the strategy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..settings.kwargs import DistributedDataParallelKwargs, TorchDynamoPlugin
from ..strategies.base import Strategy


@dataclass(kw_only=True, frozen=True)
class PrepareContext:
    """Everything an adapter needs to prepare one object, decided once by the Accelerator (read-only)."""

    device: torch.device
    """This process's device."""
    device_placement: bool
    """Move the object to `device`."""
    device_placement_requested: bool = False
    """Whether `device_placement` was asked for in the call (`prepare(..., device_placement=[...])`,
    `prepare_model(model, device_placement=...)`) rather than taken from the Accelerator's default. An
    adapter whose default rule places differently (e.g. no move in multi-process training) honours a
    request."""
    evaluation_mode: bool = False
    """Prepare for inference: precision and compilation only, no strategy wrapper."""
    mixed_precision: str = "no"
    autocast_kwargs: dict[str, Any] = field(default_factory=dict)
    strategy: Strategy
    use_distributed: bool = False
    num_processes: int = 1
    process_index: int = 0
    backend: str = ""
    """The adapter's `torch.distributed` backend (for a strategy that starts groups of its own)."""
    ddp_kwargs: DistributedDataParallelKwargs | None = None
    ddp_device_ids: list[int] | None = None
    dynamo_plugin: TorchDynamoPlugin | None = None
    adapter_defaults: dict[str, Any] = field(default_factory=dict)
    """The adapter's defaults for this strategy (`Adapter.strategy_defaults`), lowest precedence."""
    kwargs_handlers: dict[type, Any] = field(default_factory=dict)
    """The Accelerator's kwargs handlers by class, so an adapter can read its own (e.g. an fp8 recipe)."""
    precision: Any = None
    """The run's `accel.precision.Precision` (None outside an Accelerator: the adapter builds one)."""
    optimizers: tuple[torch.optim.Optimizer, ...] = ()
    """For a model: the optimizers of the same `prepare` call that hold its parameters, found by the
    core by parameter identity (for vendors that optimize a model together with its optimizer)."""

    def handler(self, kind: type) -> Any:
        """The kwargs handler that is an instance of `kind`, or None."""
        return next((h for h in self.kwargs_handlers.values() if isinstance(h, kind)), None)
