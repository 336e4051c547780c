"""The strategy contract: wrap a model for a way of spreading work, and undo it.

A strategy never sees the Accelerator. Its hooks get what they need as arguments: the
registry of prepared objects (`accel.prepare.prepared.Prepared`), a frozen `RunContext` of the run
(`wrap_model` gets the adapter's `accel.prepare.PrepareContext` instead), and for the step
just the facts (`sync`: whether this backward closes an accumulation window). A package
registers a strategy in the `accel.strategies` entry-point group under its `name`; an
adapter runs only the strategies in its `Capabilities.strategies`. docs/adapters.md
("The strategy contract") documents every hook; the prepare walk (one `Accelerator.prepare`
call; see docs/architecture.md) calls them in this order:

1. `validate_prepare(objects, ctx)` refuses combinations before anything is touched (and may set
   up what the rest needs, e.g. Megatron's parallel state); the core pairs each model with its
   optimizers and schedulers by parameter identity (`accel.prepare.group`), then calls the
   adapter's `before_prepare`.
2. Models and data loaders, then optimizers, then schedulers, whatever the order given:
   - a model goes through the adapter's `prepare_model` (placement, precision, then
     `wrap_model(model, prepare_ctx)` unless in evaluation mode, then compilation); the core
     records every parameter that replaced another and re-points optimizers at the new ones,
     once, for every strategy and adapter;
   - an optimizer, already re-pointed, goes through the adapter's `prepare_optimizer` and is
     wrapped (`AcceleratedOptimizer`); schedulers built on it follow a replacement;
   - a scheduler is wrapped (`AcceleratedScheduler`), following a replaced optimizer.
3. The adapter's `after_prepare`.
4. `setup(group, prepared, ctx)` once per group: the one place where a strategy takes a model
   with its optimizers and schedulers (DeepSpeed's `initialize`, megatron-core's optimizer and
   scheduler); what it returns replaced is put in place by the core, and schedulers follow a
   replaced optimizer unless the strategy `rebuilds_schedulers`. `Accelerator.prepare_optimizer`
   and `prepare_scheduler` called on their own run `setup` with a group of that one object.
5. `accumulation_steps()`.

So a strategy has two prepare hooks: `wrap_model` for what must wrap each model before
compilation (DDP, `fully_shard`), and `setup` for everything that pairs a model with its
optimizers and schedulers. Version-1 strategies' `prepare_optimizer`, `prepare_scheduler` and
`after_prepare` are no longer called: a strategy class that defines one is refused by name when
strategies are discovered, with a message saying to move it into `setup`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from ..distributed.distributed_type import DistributedType
    from ..prepare.context import PrepareContext
    from ..prepare.group import PrepareGroup
    from ..prepare.prepared import Prepared, RunContext


REMOVED_STRATEGY_HOOKS: dict[str, str] = {
    "prepare_optimizer": "return the replaced optimizers from `setup(group, prepared, ctx)`",
    "prepare_scheduler": "return the replaced schedulers from `setup(group, prepared, ctx)`",
    "after_prepare": "do it in `setup(group, prepared, ctx)`, which runs once per model and its optimizers",
}
"""Version-1 strategy hooks the core no longer calls, with what to do instead: a strategy class that
defines one is refused by name when strategies are discovered (`accel.adapter.registry.strategy_records`)."""


class Strategy:
    """Base class: a strategy that leaves the model as it is (one process).

    Every hook has a default that does nothing special, so a strategy overrides only what
    it changes. The Accelerator builds one instance per run, at construction.
    """

    name: ClassVar[str] = "none"
    """The name users select it by (`Accelerator(strategy=...)`, `ACCEL_STRATEGY`); the same as its
    entry-point name in `accel.strategies` and the name adapters list in `Capabilities.strategies`."""

    def __init__(self, config: Any = None) -> None:
        """`config`: the strategy's own configuration (`Accelerator(strategy_config=...)` or the plugin
        that selected it, e.g. `fsdp_plugin=`), None when the user gave none."""
        self.config = config

    def distributed_type(self, use_distributed: bool) -> DistributedType | None:
        """What `Accelerator.distributed_type` reports under this strategy.

        None (the default) means plain data parallelism (or one process), which the adapter
        names for its hardware (`Adapter.data_parallel_type`: NO, MULTI_CPU, MULTI_<DEVICE>, ...).
        """
        return None

    def wrap_model(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        """Wrap one placed, precision-converted model (DDP, `fully_shard`, ...); called by the adapter's
        `apply_strategy` step of `prepare_model`, before compilation, never in evaluation mode.
        Default: the model unchanged."""
        return model

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever this strategy wrapped it in."""
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        """Whether `model` is already this strategy's wrapper (for the strategy's own checks). Default: False."""
        return False

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation inside the context (gradient accumulation)."""
        return contextlib.nullcontext()

    scales_loss_for_accumulation: ClassVar[bool] = True
    """Whether `Accelerator.backward` divides the loss by the accumulation steps
    (False for strategies whose engine does it itself)."""

    def data_parallel_group(self) -> Any:
        """The process group whose ranks hold different data (None: every process).

        Strategies that split a model over several processes (tensor or pipeline
        parallelism) return the group of model replicas: prepared data loaders are sharded
        over it only, so every process of one replica sees the same batches, and
        `gather_for_metrics` and `reduce` run over it.
        """
        return None

    owns_loss_scaling: ClassVar[bool] = False
    """Whether the strategy's engine scales the fp16 loss itself (then the Accelerator makes no grad scaler)."""

    compiles_model: ClassVar[bool] = False
    """Whether the strategy compiles the model itself, in `setup`, once its engine exists (e.g. DeepSpeed's
    `engine.compile`); then `Adapter.compile_model` leaves a model it wraps uncompiled. The strategy reads the
    settings from `RunContext.dynamo_plugin` through `Adapter.dynamo_settings` and `Adapter.compile_backend`."""

    def validate_device_placement(self, device_placement: list[bool]) -> None:
        """Refuse a per-object `device_placement` list the strategy cannot honour (raise ValueError)."""

    def validate_prepare(self, objects: tuple[Any, ...], ctx: RunContext) -> None:
        """Refuse combinations this strategy cannot prepare (raise ValueError saying why); runs first in
        every `prepare` call, with the objects as given (already prepared ones included)."""

    def setup(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """Take one model with the optimizers and schedulers that train it; return the group to train with.

        Called once per group of a `prepare` call, after every object is placed and wrapped:
        `group.model` is the prepared model (None for optimizers prepared without theirs),
        `group.optimizers`/`group.schedulers` the objects inside accel's wrappers, their
        parameters already the model's current ones. Return `group` unchanged (the default)
        or `group.replace(model=..., optimizers=[...], schedulers=[...])` with the same
        number of optimizers and schedulers: the core puts each replacement into the
        prepared wrapper and the registry, and a scheduler the strategy did not replace
        follows a replaced optimizer (`accel.scheduler.follow_replaced_optimizer`).
        `prepared` holds everything prepared so far (e.g. the data loaders, for a batch size).
        """
        return group

    def accumulation_steps(self) -> int | None:
        """Gradient accumulation steps the strategy's engine fixed (read at the end of every `prepare` call,
        after `setup`); None: the user's setting stands."""
        return None

    rebuilds_schedulers: ClassVar[bool] = False
    """True for a strategy whose `setup` builds its own schedulers over the optimizers it replaced
    (also for schedulers prepared in a later call, which `setup` then receives alone); otherwise the
    core points the user's schedulers at a replaced optimizer."""

    def after_backward(self, sync: bool) -> None:
        """Runs after every `Accelerator.backward`; `sync` says whether this backward closes an
        accumulation window (gradients must be synchronised now). For strategies that reduce
        gradients themselves instead of through a wrapper's hooks; the default does nothing."""

    def backward(self, loss: torch.Tensor, *, sync: bool, **kwargs: Any) -> bool:
        """Run the backward pass of the (already scaled) loss; `sync` says whether this backward closes an
        accumulation window. Default: `loss.backward(**kwargs)`. Returns True; a strategy written for
        version 1 of the contract may return False, and the core then runs `loss.backward(**kwargs)`."""
        loss.backward(**kwargs)
        return True

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        """Clip gradients the strategy's way; None lets the adapter do it."""
        return None

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The complete, unsharded state dict of the user's module (for `save_model`).

        Called on every process; sharded strategies gather here.
        """
        return self.unwrap(model).state_dict()

    def load_full_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> None:
        """Load a full state dict (as `full_state_dict` returns) into the prepared model."""
        self.unwrap(model).load_state_dict(state_dict, strict=strict)

    takes_save_kwargs: ClassVar[bool] = False
    """Whether `save_checkpoint_state` passes `ctx.save_model_kwargs` (the keyword arguments of
    `Accelerator.save_state`) to its engine's save, as Accelerate does for DeepSpeed's `save_checkpoint`;
    otherwise the Accelerator warns that they are ignored."""

    reserved_save_kwargs: ClassVar[tuple[str, ...]] = ()
    """Keyword arguments of the engine's save that accel sets itself (a checkpoint's directory and
    tags): `save_state` refuses them with a ValueError before writing anything."""

    def save_checkpoint_state(
        self, prepared: Prepared, ctx: RunContext, directory: Path, *, writer: bool, safe_serialization: bool
    ) -> list[str] | None:
        """Write the prepared models and optimizers into `directory` the strategy's way.

        Called by `save_state` on every process (gathers and sharded writes are collective);
        `writer` says whether this process writes the shared files. Returns the names
        written, or None to let `accel.checkpoint` write its default files.
        """
        return None

    def load_checkpoint_state(self, prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> bool:
        """Restore what `save_checkpoint_state` wrote; False lets `accel.checkpoint` load its defaults."""
        return False
