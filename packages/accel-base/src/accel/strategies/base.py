"""The strategy contract: wrap a model for a way of spreading work, and undo it.

A strategy never sees the Accelerator. Its hooks get what they need as arguments: the
registry of prepared objects (`accel.prepare.prepared.Prepared`), the frozen `RunContext` of the
run (inside `prepare` with the facts of the object being prepared), and for the step just the
facts (`sync`: whether this backward closes an accumulation window). A package registers a
strategy in the `accel.strategies` entry-point group under its `name`; an adapter runs only the
strategies in its `Capabilities.strategies`. docs/adapters.md ("The strategy contract") documents
every hook. In the prepare walk (`accel.prepare.walk`) the core calls a strategy at two points only:

1. `validate_prepare(objects, ctx)` refuses combinations before anything is touched (and may set
   up what the rest needs, e.g. Megatron's parallel state).
2. `prepare_group(group, prepared, ctx)`, its one prepare entry, once per group: a model (already
   placed and converted to the run's precision, not yet compiled) with the optimizers that train
   it (re-pointed at its parameters, after the adapter's `prepare_optimizer`) and their schedulers.
   The default runs `wrap_model` on the model (DDP, `fully_shard`: what must wrap it before
   compilation), then `setup` on the group (what pairs a model with its optimizers and
   schedulers: DeepSpeed's `initialize`, megatron-core's optimizer and scheduler); a strategy
   overrides whichever of the two it needs. What it returns replaced is put in place by the core,
   optimizers follow parameters it replaced, and schedulers follow a replaced optimizer unless the
   strategy `rebuilds_schedulers`. `Accelerator.prepare_optimizer` and `prepare_scheduler` called on
   their own give a group of that one object; `Accelerator.prepare_model` on its own runs
   `wrap_model` only (as Accelerate builds engines only in `prepare`).

Then the core compiles the model (unless `compiles_model`), wraps optimizers and schedulers, and
reads `accumulation_steps()`. Version-1 strategies' `prepare_optimizer`, `prepare_scheduler` and
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
    from ..prepare.context import RunContext
    from ..prepare.group import PrepareGroup
    from ..prepare.prepared import Prepared
    from .parallelism_config import MeshFacts


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

    config_class: ClassVar[type[Any] | None] = None
    """The class of the strategy's own configuration (its plugin dataclass), so config files and Accelerate's
    settings (`accel.settings.strategy_config`) build it without the core importing the strategy's package."""

    parallelism: Any = None
    """The run's `ParallelismConfig` once `bind_parallelism` gave it one (None: plain data parallelism)."""
    device_mesh: Any = None
    """The run's device mesh once `bind_parallelism` gave it one (None on one process, or without one)."""

    def learn_run(self, run: MeshFacts) -> None:
        """Receive the run's facts (processes, device type, backend, precision, the adapter's capabilities) right
        after the Accelerator builds the strategy, before anything is prepared: for a strategy asked for
        something before `prepare` (DeepSpeed's ZeRO-3 config, read by transformers). Default: nothing."""

    def distributed_type(self, use_distributed: bool) -> DistributedType | None:
        """What `Accelerator.distributed_type` reports under this strategy.

        None (the default) means plain data parallelism (or one process), which the adapter
        names for its hardware (`Adapter.data_parallel_type`: NO, MULTI_CPU, MULTI_<DEVICE>, ...).
        """
        return None

    def prepare_group(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """The strategy's one prepare entry, called by the core once per group (never in evaluation mode):
        `wrap_model` on the group's model, then `setup` on the group. Returns the group to train with."""
        if group.model is not None:
            group = group.replace(model=self.wrap_model(group.model, ctx))
        return self.setup(group, prepared, ctx)

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Wrap one placed, precision-converted model (DDP, `fully_shard`, ...), before compilation, never in
        evaluation mode (from `prepare_group`). Default: the model unchanged."""
        return model

    needs_model_on_device: ClassVar[bool] = False
    """Whether the strategy replicates the model over processes as it is (DDP): in multi-process training a
    model the adapter did not move (`Adapter.places_model`) must already be on the device, and the walk
    refuses one that is not, by name, before the strategy fails inside a collective."""

    def optimizer_on_host(self) -> bool:
        """Whether the strategy steps its own host optimizer instead of the user's (DeepSpeed's ZeRO-Offload
        CPU optimizer), so that a vendor's device-fused replacement would never run
        (`RunContext.optimizer_on_host`, read by adapters in `prepare_optimizer`). Default: False."""
        return False

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

    def grad_scaler(self, scaler: Any) -> Any:
        """The fp16 scaler the run steps with, given the adapter's (`Adapter.make_grad_scaler`; None: no loss
        scaling). Default: the adapter's. A strategy whose gradients are per-rank shards of flat buffers returns
        one that agrees on inf/nan over every rank, so a step is skipped everywhere or nowhere."""
        return scaler

    keeps_gradients: ClassVar[bool] = False
    """Whether a prepared optimizer's `zero_grad()` zeroes the gradients in place by default instead of dropping
    them (`set_to_none=False`): for a strategy that reduces through work recorded once on fixed gradient
    tensors (device graphs). An explicit `zero_grad(set_to_none=...)` still decides."""

    owns_loss_scaling: ClassVar[bool] = False
    """Whether the strategy's engine scales the fp16 loss itself (then the Accelerator makes no grad scaler)."""

    compiles_regions_in_place: ClassVar[bool] = False
    """Whether regional compilation (`TorchDynamoPlugin.use_regional_compilation`) of a model this strategy
    wrapped compiles its blocks in place (`module.compile()`), because the strategy's hooks sit on those
    modules (FSDP2's `fully_shard`), with Accelerate's dynamo settings for that path."""

    compiles_model: ClassVar[bool] = False
    """Whether the strategy compiles the model itself, in `setup`, once its engine exists (e.g. DeepSpeed's
    `engine.compile`); then the walk leaves a model it wraps uncompiled. The strategy reads the settings with
    `accel.prepare.wrappers.compile_settings(ctx.adapter, ctx.dynamo_plugin)`."""

    def validate_device_placement(self, device_placement: list[bool]) -> None:
        """Refuse a per-object `device_placement` list the strategy cannot honour (raise ValueError)."""

    def validate_prepare(self, objects: tuple[Any, ...], ctx: RunContext) -> None:
        """Refuse combinations this strategy cannot prepare (raise ValueError saying why); runs first in
        every `prepare` call, with the objects as given (already prepared ones included)."""

    def setup(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """Take one model with the optimizers and schedulers that train it; return the group to train with.

        Called by `prepare_group` once per group of a `prepare` call, after `wrap_model`:
        `group.model` is the wrapped model (None for optimizers prepared without theirs, not yet
        compiled), `group.optimizers`/`group.schedulers` the user's objects (accel wraps them after),
        the optimizers' parameters already the model's placed ones. Return `group` unchanged (the default)
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

    def before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Runs before each real step of a prepared optimizer (the inner optimizer): for strategies that
        reduce gradients themselves and must still reduce the ones a bare `loss.backward()` left (a
        hardware's own data parallelism without a wrapper). Not called unless overridden, so it costs nothing per step otherwise."""

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

    takes_load_kwargs: ClassVar[frozenset[str]] = frozenset()
    """Keyword arguments of `Accelerator.load_state` that `load_checkpoint_state` passes to its engine's load
    (`ctx.load_model_kwargs`), as Accelerate does for DeepSpeed's `load_checkpoint`; any other is refused."""

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

    def loads_checkpoint_models(self, prepared: Prepared) -> bool:
        """Whether `load_checkpoint_state` restores the prepared models and optimizers itself, from whichever
        layout saved them, so that `load_state` does not read them; otherwise `load_state` loads them, from
        the default files or sharded (torch.distributed.checkpoint) folders, and refuses any other strategy's.
        By default: whether the strategy defines its own `load_checkpoint_state`."""
        return type(self).load_checkpoint_state is not Strategy.load_checkpoint_state
