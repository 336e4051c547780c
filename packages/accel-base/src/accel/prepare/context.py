"""The one context the core hands to adapters, strategies and checkpoints: `RunContext`.

It is a frozen record of the run, built by the Accelerator for each call into them: the
process (device, ranks, backend), the run's settings (precision, accumulation, DDP and compile
settings, kwargs handlers), who runs it (adapter, strategy, precision) and, inside `prepare`,
the facts of the object being prepared (placement, evaluation mode, the optimizers paired with
a model). `PrepareContext` is the same class under the name adapters of contract versions 1
and 2 know: prepare and run share one type, so no fact is carried twice.

Nothing here is writable: a strategy that must change a setting says so through its own hooks
(`Strategy.accumulation_steps`), never by writing into the Accelerator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..precision.fp8_request import NO_FP8_REQUEST, FP8Request

if TYPE_CHECKING:
    from ..adapter.base import Adapter
    from ..precision.base import Precision
    from ..settings.kwargs import DistributedDataParallelKwargs, TorchDynamoPlugin
    from ..strategies.base import Strategy


@dataclass(kw_only=True, frozen=True)
class RunContext:
    """The run as adapters, strategies and checkpoints see it (read-only, built for each call)."""

    # ---- the process ---------------------------------------------------------------------------
    device: torch.device
    """This process's device."""
    process_index: int = 0
    local_process_index: int = 0
    num_processes: int = 1
    local_num_processes: int = 1
    """Processes on this node (the launcher's local world size), e.g. for a strategy that shards within nodes."""
    is_main_process: bool = True
    is_local_main_process: bool = True
    use_distributed: bool = False
    backend: str = ""
    """The adapter's `torch.distributed` backend (for a strategy that starts groups of its own)."""

    # ---- the run's settings --------------------------------------------------------------------
    mixed_precision: str = "no"
    """The run's precision ("no", "bf16", "fp16", "fp8")."""
    autocast_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the forward's autocast (`AutocastKwargs`)."""
    gradient_accumulation_steps: int = 1
    split_batches: bool = False
    """Whether each batch of a prepared loader is split over the processes."""
    save_on_each_node: bool = False
    """Whether the local main process of every node writes checkpoints (not only rank 0)."""
    ddp_kwargs: DistributedDataParallelKwargs | None = None
    ddp_device_ids: list[int] | None = None
    """`device_ids` for DistributedDataParallel (the adapter's `ddp_device_ids`)."""
    dynamo_plugin: TorchDynamoPlugin | None = None
    """The run's torch.compile settings as the user gave them (the walk asks the adapter what applies)."""
    kwargs_handlers: dict[type, Any] = field(default_factory=dict)
    """The Accelerator's kwargs handlers by class, so an adapter or precision can read its own (an fp8 recipe)."""
    fp8: FP8Request = NO_FP8_REQUEST
    """The fp8 recipe asked for (Accelerate's recipe handlers, the launcher's fp8 settings), in backend-neutral
    terms: an adapter's fp8 precision applies each setting or refuses it by name (`FP8Request.refuse`)."""
    adapter_defaults: dict[str, Any] = field(default_factory=dict)
    """The adapter's defaults for this strategy (`Adapter.strategy_defaults`), lowest precedence."""
    optimizer_on_host: bool = False
    """The strategy steps its own host optimizer instead of the user's (DeepSpeed's ZeRO-Offload CPU
    optimizer, `Strategy.optimizer_on_host`): a device-fused replacement would never run."""

    # ---- who runs it ---------------------------------------------------------------------------
    adapter: Adapter
    strategy: Strategy
    precision: Precision | None = None
    """The run's `accel.precision.Precision` (None outside an Accelerator)."""

    # ---- inside `prepare`: the object being prepared ------------------------------------------
    device_placement: bool = False
    """Move the object to `device` (the call's `device_placement`, else the Accelerator's default)."""
    device_placement_requested: bool = False
    """Whether `device_placement` was asked for in the call (`prepare(..., device_placement=[...])`,
    `prepare_model(model, device_placement=...)`) rather than taken from the Accelerator's default. An
    adapter whose default rule places differently (e.g. no move in multi-process training) honours a
    request."""
    evaluation_mode: bool = False
    """Prepare for inference: placement, the vendor's optimisation, precision and compilation; no strategy."""
    optimizers: tuple[torch.optim.Optimizer, ...] = ()
    """For a model: the optimizers of the same `prepare` call that hold its parameters, found by the
    core by parameter identity (for vendors that optimize a model together with its optimizer)."""

    # ---- inside `prepare_data_loader` ----------------------------------------------------------
    data_loader: Any = None
    """In `prepare_data_loader_kwargs`: the user's `DataLoader` being prepared (by `prepare` or
    `prepare_data_loader`), to read (its `num_workers`, its `multiprocessing_context`); never changed."""

    # ---- inside `save_state` --------------------------------------------------------------------
    save_model_kwargs: dict[str, Any] = field(default_factory=dict)
    """In `save_checkpoint_state`: the keyword arguments the user gave `save_state` (Accelerate's
    `save_model_func_kwargs`), for a strategy whose engine saves itself (`Strategy.takes_save_kwargs`)."""
    load_model_kwargs: dict[str, Any] = field(default_factory=dict)
    """`Accelerator.load_state`'s keyword arguments that the strategy's engine load takes
    (`Strategy.takes_load_kwargs`), as Accelerate passes them to DeepSpeed's `load_checkpoint`."""

    def handler(self, kind: type) -> Any:
        """The kwargs handler that is an instance of `kind`, or None."""
        return next((h for h in self.kwargs_handlers.values() if isinstance(h, kind)), None)


PrepareContext = RunContext
"""The name adapters and strategies of contract versions 1 and 2 know for the context `prepare` hands them."""
