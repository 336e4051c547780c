"""The prepare walk: the one module that takes objects from the user to the training loop.

`Accelerator.prepare` hands its objects here; the walk goes one way, and the core drives it:

1. the strategy's `validate_prepare`; the objects are paired by parameter identity (`group`);
   the adapter's `before_prepare`;
2. data loaders are sharded (through the Accelerator, which owns the data-loader settings);
3. each model: the adapter's `places_model`/`place_model`, its `optimize_model`, then the run's
   precision converts it (`Precision.convert_module`: fp8 layers, the autocast forward); optimizers
   are re-pointed at the parameters this replaced;
4. each optimizer: re-pointed, then the adapter's `prepare_optimizer` (a vendor's fused one);
   schedulers follow a replaced optimizer;
5. each group (a model with its optimizers and schedulers): the strategy's one entry,
   `Strategy.prepare_group` (`wrap_model`, then `setup`); what it returns replaced is put in
   place, and optimizers follow parameters it replaced (`fully_shard`'s DTensors);
6. each model is compiled with the backend the adapter names (`compile_settings`), unless the
   strategy compiles its own engine;
7. optimizers and schedulers are wrapped (`AcceleratedOptimizer`, `AcceleratedScheduler`), everything
   is recorded in the registry (`Prepared`), the adapter's `after_prepare` runs, and the objects come
   back in the order given.

The adapter only answers; it never calls the strategy, and precision never calls back into the
adapter's prepare. Adapters of contract versions 1 and 2 that still define `prepare_model` (or one of
its steps) run it in place of step 3 and the strategy's `wrap_model` (`accel.adapter.legacy`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..adapter.legacy import runs_own_prepare, warn_legacy
from ..distributed.distributed_type import DistributedType
from ..precision.base import precision_of
from .context import RunContext
from .group import (
    GroupIndex,
    ParameterMap,
    PrepareGroup,
    check_detached_optimizers,
    group_objects,
    holds_parameters_of,
    is_prepared,
    kind_of,
)
from .wrappers import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    compile_model,
    compile_settings,
    follow_replaced_optimizer,
    unwrap_through,
)

if TYPE_CHECKING:
    from ..adapter.base import Adapter
    from .prepared import Prepared


# ---- where a model goes -----------------------------------------------------------------------
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


# ---- the steps one model takes ----------------------------------------------------------------
def convert_model(model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
    """Everything a model goes through before the strategy: placement (`Adapter.places_model`,
    `Adapter.place_model`), the vendor's optimisation (`Adapter.optimize_model`), precision
    (`Precision.convert_module`)."""
    adapter = ctx.adapter
    if adapter.places_model(ctx):
        model = adapter.place_model(model, ctx)
    model = adapter.optimize_model(model, ctx)
    return precision_of(ctx).convert_module(model, ctx)


def compile_step(model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
    """The walk's last model step: `torch.compile` with `compile_settings`, unless the strategy compiles its
    own engine (`Strategy.compiles_model`, outside evaluation mode)."""
    if _legacy(ctx.adapter):
        return model  # a contract-1/2 adapter's own prepare_model compiled it already
    settings = compile_settings(ctx.adapter, ctx.dynamo_plugin)
    if settings is None or (ctx.strategy.compiles_model and not ctx.evaluation_mode):
        return model
    in_place = ctx.strategy.compiles_regions_in_place and not ctx.evaluation_mode
    return compile_model(
        model, settings, default_backend=str(settings.backend), in_place=in_place, regions=ctx.adapter.compile_regions
    )


def model_walk(model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
    """The walk's steps for one model outside an Accelerator's registry (the conformance kit's decision
    check, an adapter's own tests): `convert_model`, the on-device check, the strategy's `wrap_model` (not
    in evaluation mode), `compile_step`. A contract-1/2 adapter's own `prepare_model` runs instead."""
    if _legacy(ctx.adapter):
        return ctx.adapter.prepare_model(model, ctx)  # type: ignore[no-any-return]
    model = convert_model(model, ctx)
    check_on_device(model, ctx)
    if not ctx.evaluation_mode:
        model = ctx.strategy.wrap_model(model, ctx)
    return compile_step(model, ctx)


def _legacy(adapter: Adapter) -> bool:
    return runs_own_prepare(type(adapter))


_IDENTITY = ("parameters", "_replaced_optimizers", "_adapter_repointed", "_wrapped_by_adapter")
"""The walk's identity bookkeeping: weak references to this process's objects, dropped when it is pickled."""


class PrepareWalk:
    """The prepare walk of one Accelerator: what it prepared, and how optimizers follow replaced parameters.

    The Accelerator builds one and delegates `prepare`, `prepare_model`, `prepare_optimizer` and
    `prepare_scheduler` to it; the walk receives the pieces it drives (never the Accelerator).
    """

    def __init__(
        self,
        *,
        prepared: Prepared,
        context: Callable[..., RunContext],
        placement_default: Callable[[], bool],
        check_placement: Callable[[torch.nn.Module, bool], bool],
        scheduler_options: Callable[[], dict[str, Any]],
        allow_detached_optimizers: bool = False,
    ) -> None:
        """`context(**facts)`: the run's context with the facts of one object; `placement_default()`: the
        Accelerator's `device_placement`; `check_placement(model, placement)`: Accelerate's rules for
        quantized and `device_map` models (the placement to use); `scheduler_options()`: the
        `AcceleratedScheduler` settings (`step_with_optimizer`, `split_batches`, `num_data_shards`);
        `allow_detached_optimizers`: accept an optimizer holding no prepared model's parameters
        (`ACCEL_ALLOW_DETACHED_OPTIMIZERS`), else `prepare` refuses it."""
        self.prepared = prepared
        self._context = context
        self._placement_default = placement_default
        self._check_placement = check_placement
        self._scheduler_options = scheduler_options
        self._allow_detached_optimizers = allow_detached_optimizers
        # Parameters that preparing a model replaced -> their replacements (optimizers are re-pointed).
        self.parameters: ParameterMap
        self._replaced_optimizers: dict[int, tuple[weakref.ref[Any], Any]]
        self._adapter_repointed: weakref.WeakSet[Any]
        self._wrapped_by_adapter: weakref.WeakSet[torch.nn.Module]
        self._forget_identities()

    # ---- one call ----------------------------------------------------------------------------
    def prepare(
        self,
        objects: Sequence[Any],
        placements: Sequence[bool | None],
        prepare_loader: Callable[[Any, bool | None], Any],
    ) -> list[Any]:
        """Prepare `objects` (any order) and return them prepared, in the order given."""
        run = self._context()
        run.strategy.validate_prepare(tuple(objects), run)
        fresh: list[Any] = [None if is_prepared(o) else o for o in objects]
        # Paired by parameter identity before preparing changes any parameter.
        kinds = [kind_of(o) for o in fresh]
        kind = dict(zip(map(id, fresh), kinds))
        groups = group_objects(
            fresh,
            is_model=lambda o: kind.get(id(o)) == "model",
            is_optimizer=lambda o: kind.get(id(o)) == "optimizer",
            is_scheduler=lambda o: kind.get(id(o)) == "scheduler",
        )
        default = self._placement_default()
        run.adapter.before_prepare(list(objects), self._context(device_placement=default))
        result = list(objects)
        for i, obj in enumerate(fresh):
            if kinds[i] == "loader":
                result[i] = prepare_loader(obj, placements[i])
        for index in groups:
            if index.model is not None:
                model = fresh[index.model]
                # Every optimizer of the call holding one of its parameters, for adapters that optimize the two
                # together (and refuse an optimizer shared by two models).
                paired = tuple(o for o in fresh if holds_parameters_of(o, model))
                result[index.model] = self._convert(model, placements[index.model], paired)
        for i, obj in enumerate(fresh):
            if kinds[i] == "optimizer":
                result[i] = self._vendor_optimizer(obj, placements[i])
            elif kinds[i] == "scheduler":
                result[i] = self._follow(obj)
        for index in groups:
            self._strategy(index, result, placements)
        models = [i for i, k in enumerate(kinds) if k == "model"]
        for i in models:
            result[i] = compile_step(result[i], self._context(device_placement=self._placement(placements[i])))
            self.prepared.models.append(result[i])
        wrapped = self._wrap(result, kinds, placements)
        for i, obj in wrapped.items():
            result[i] = obj
        run.adapter.after_prepare(result, self._context(device_placement=default))
        # Checked once everything is placed and re-pointed, on the optimizers this call wrapped as they were
        # given, except those paired with a model of this call by parameter identity: they train it by
        # construction, whatever the adapter's preparing then made of the two (a vendor may keep the
        # optimizer's tensors as masters and give the model new ones).
        paired_positions = {i for index in groups if index.model is not None for i in index.optimizers}
        check_detached_optimizers(
            [
                res.optimizer
                for i, (obj, res) in enumerate(zip(objects, result))
                if i not in paired_positions and getattr(res, "optimizer", None) is obj
            ],
            self.prepared.models,
            allowed=self._allow_detached_optimizers,
        )
        for obj in result:
            try:
                obj._is_accel_prepared = True
            except (AttributeError, TypeError):
                pass
        return result

    def __getstate__(self) -> dict[str, Any]:
        # Identity bookkeeping (weak references to this process's objects) cannot be pickled and means nothing
        # for the copy unpickling makes (a pickled Accelerator): it starts empty there.
        state = dict(self.__dict__)
        for key in _IDENTITY:
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._forget_identities()

    def _forget_identities(self) -> None:
        self.parameters = ParameterMap()
        self._replaced_optimizers = {}
        self._adapter_repointed = weakref.WeakSet()
        self._wrapped_by_adapter = weakref.WeakSet()

    # ---- one object alone --------------------------------------------------------------------
    def prepare_model(
        self, model: torch.nn.Module, placement: bool | None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """One model on its own (`Accelerator.prepare_model`): steps 3, 5 (not in evaluation mode) and 6."""
        converted = self._convert(model, placement, (), evaluation_mode=evaluation_mode)
        ctx = self._context(device_placement=self._placement(placement), evaluation_mode=evaluation_mode)
        if not evaluation_mode and converted not in self._wrapped_by_adapter:
            # Alone, a model is wrapped and paired with nothing: `setup` runs for the groups of `prepare`
            # (and for optimizers and schedulers prepared on their own), as Accelerate builds an engine
            # only in `prepare`.
            before = ParameterMap.snapshot(converted)
            converted = ctx.strategy.wrap_model(converted, ctx)
            self._record(before, converted, ctx.strategy)
        prepared = compile_step(converted, ctx)
        self.prepared.models.append(prepared)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, placement: bool | None) -> AcceleratedOptimizer:
        """One optimizer on its own (`Accelerator.prepare_optimizer`): the strategy sees it as a group of one."""
        if is_prepared(optimizer):
            if optimizer not in self.prepared.optimizers:
                self.prepared.optimizers.append(optimizer)
            return optimizer  # type: ignore[return-value]
        result: list[Any] = [self._vendor_optimizer(optimizer, placement)]
        self._strategy(GroupIndex(optimizers=[0]), result, [placement])
        return self._wrap(result, ["optimizer"], [placement])[0]  # type: ignore[no-any-return]

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """One scheduler on its own (`Accelerator.prepare_scheduler`): the strategy sees it as a group of one."""
        if is_prepared(scheduler):
            return scheduler  # type: ignore[no-any-return]
        result: list[Any] = [self._follow(scheduler)]
        self._strategy(GroupIndex(schedulers=[0]), result, [None])
        return self._wrap(result, ["scheduler"], [None])[0]  # type: ignore[no-any-return]

    # ---- the steps ----------------------------------------------------------------------------
    def _placement(self, placement: bool | None) -> bool:
        return self._placement_default() if placement is None else placement

    def _convert(
        self,
        model: torch.nn.Module,
        placement: bool | None,
        paired: tuple[Any, ...],
        *,
        evaluation_mode: bool = False,
    ) -> torch.nn.Module:
        """Step 3 for one model; optimizers already prepared follow the parameters it replaced."""
        place = self._check_placement(model, self._placement(placement))
        ctx = self._context(
            device_placement=place,
            device_placement_requested=placement is not None,
            evaluation_mode=evaluation_mode,
            optimizers=paired,
        )
        before = ParameterMap.snapshot(model)
        if _legacy(ctx.adapter):
            # A contract-1/2 adapter runs its own prepare_model (placement to compilation, the strategy's
            # wrap_model included); the walk then hands the group to the strategy's `setup` only.
            warn_legacy(ctx.adapter)
            converted = ctx.adapter.prepare_model(model, ctx)
            if not evaluation_mode:
                self._wrapped_by_adapter.add(converted)
        else:
            converted = convert_model(model, ctx)
            check_on_device(converted, ctx)
        if ctx.adapter.repoints_paired_optimizers:
            self._adapter_repointed.update(paired)
        self._record(before, converted, ctx.strategy)
        return converted

    def _record(self, before: dict[str, torch.Tensor], model: torch.nn.Module, strategy: Any) -> None:
        if self.parameters.record(before, unwrap_through(model, strategy, keep_torch_compile=False)):
            # Optimizers prepared in an earlier call than their model follow it too.
            for wrapper in self.prepared.optimizers:
                if wrapper.optimizer not in self._adapter_repointed:
                    self.parameters.repoint(wrapper.optimizer)

    def _vendor_optimizer(self, optimizer: torch.optim.Optimizer, placement: bool | None) -> torch.optim.Optimizer:
        """Step 4 for one optimizer: onto its model's new parameters (once, here), then the adapter's hook."""
        original = optimizer
        if optimizer not in self._adapter_repointed:
            self.parameters.repoint(optimizer)
        ctx = self._context(device_placement=self._placement(placement))
        optimizer = ctx.adapter.prepare_optimizer(optimizer, ctx)
        if optimizer is not original:  # schedulers follow the adapter's replacement (a fused optimizer)
            self._follow_replaced_optimizer(original, optimizer)
        return optimizer

    def _follow(self, scheduler: Any) -> Any:
        """A scheduler built on an optimizer that the adapter or strategy replaced follows the replacement."""
        optimizer = scheduler.optimizer
        replacement = self._replaced_optimizers.get(id(optimizer))
        if replacement is not None and replacement[0]() is optimizer:
            follow_replaced_optimizer(scheduler, optimizer, replacement[1])
        return scheduler

    def _strategy(self, index: GroupIndex, result: list[Any], placements: Sequence[bool | None]) -> None:
        """Step 5: one group through the strategy's one entry; replacements go back into `result`."""
        model = None if index.model is None else result[index.model]
        group = PrepareGroup(
            model=model,
            optimizers=[result[i] for i in index.optimizers],
            schedulers=[result[i] for i in index.schedulers],
        )
        placement = None if index.model is None else placements[index.model]
        ctx = self._context(
            device_placement=self._placement(placement),
            device_placement_requested=placement is not None,
            optimizers=tuple(group.optimizers),
        )
        strategy = ctx.strategy
        before = None if model is None else ParameterMap.snapshot(unwrap_through(model, strategy))
        if model is not None and model in self._wrapped_by_adapter:
            new = strategy.setup(group, self.prepared, ctx)  # the adapter's apply_strategy wrapped it already
        else:
            new = strategy.prepare_group(group, self.prepared, ctx)
        if len(new.optimizers) != len(group.optimizers) or len(new.schedulers) != len(group.schedulers):
            raise TypeError(
                f"{type(strategy).__name__}.setup must return a group with as many optimizers and schedulers as "
                f"it received ({len(group.optimizers)} and {len(group.schedulers)}), each replaced or unchanged."
            )
        if index.model is not None:
            result[index.model] = new.model
            if before is not None and new.model is not None:
                # Parameters the strategy replaced (`fully_shard`'s DTensors): the group's optimizers it kept,
                # and those prepared earlier, follow them.
                self._record(before, new.model, strategy)
                for old, replacement in zip(group.optimizers, new.optimizers):
                    if replacement is old and old not in self._adapter_repointed:
                        self.parameters.repoint(old)
        # Schedulers the strategy replaced first: those it kept then follow a replaced optimizer.
        for i, replacement in zip(index.schedulers, new.schedulers):
            result[i] = replacement
        for i, old, replacement in zip(index.optimizers, group.optimizers, new.optimizers):
            result[i] = replacement
            if replacement is not old and not strategy.rebuilds_schedulers:
                self._follow_replaced_optimizer(old, replacement)
                for j in index.schedulers:
                    if result[j].optimizer is old:
                        follow_replaced_optimizer(result[j], old, replacement)

    def _wrap(
        self, result: list[Any], kinds: Sequence[str | None], placements: Sequence[bool | None]
    ) -> dict[int, Any]:
        """Step 7: optimizers, then schedulers, in accel's wrappers and in the registry."""
        ctx = self._context()
        wrapped: dict[int, Any] = {}
        for i, kind in enumerate(kinds):
            if kind == "optimizer":
                wrapper = AcceleratedOptimizer(
                    result[i],
                    device_placement=self._placement(placements[i]),
                    adapter=ctx.adapter,
                    device=ctx.device,
                    precision=ctx.precision,
                    before_step=_before_step(ctx.strategy),
                    keep_gradients=ctx.strategy.keeps_gradients,
                )
                self.prepared.optimizers.append(wrapper)
                wrapped[i] = wrapper
        for i, kind in enumerate(kinds):
            if kind == "scheduler":
                scheduler = result[i]
                inner = scheduler.optimizer
                optimizers = [o for o in self.prepared.optimizers if o.optimizer is inner or o is inner] or [inner]
                sched = AcceleratedScheduler(scheduler, optimizers, **self._scheduler_options())
                self.prepared.schedulers.append(sched)
                wrapped[i] = sched
        return wrapped

    def _follow_replaced_optimizer(self, old: torch.optim.Optimizer, new: torch.optim.Optimizer) -> None:
        """Schedulers follow an optimizer the strategy or adapter replaced: those prepared already
        now, and those prepared later (in this or a later `prepare` call) when they are wrapped."""
        self._replaced_optimizers[id(old)] = (weakref.ref(old), new)
        for sched in self.prepared.schedulers:
            if sched.scheduler.optimizer is old:
                follow_replaced_optimizer(sched.scheduler, old, new)


def _before_step(strategy: Any) -> Callable[[torch.optim.Optimizer], None] | None:
    """The strategy's `before_optimizer_step`, or None when it keeps the base's (nothing to call per step)."""
    from ..strategies.base import Strategy

    overridden = type(strategy).before_optimizer_step is not Strategy.before_optimizer_step
    return strategy.before_optimizer_step if overridden else None  # type: ignore[no-any-return]
