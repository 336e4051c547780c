"""What the walk wraps prepared objects in, and how to look through it: `torch.compile` (applied last and
only once, whole-model or one block at a time, with the settings the adapter allows), and the prepared
optimizer and scheduler (`AcceleratedOptimizer`, `AcceleratedScheduler`, Accelerate's names, also at
`accel.optimizer` and `accel.scheduler`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from ..distributed.gradient_state import GradientState
from ..distributed.tree import send_to_device
from ..errors import CompileNotSupportedError
from ..precision.base import Precision
from ..settings.kwargs import TorchDynamoPlugin

if TYPE_CHECKING:
    from ..adapter.base import Adapter


# ---- torch.compile ---------------------------------------------------------------------------------
def is_compiled_module(module: torch.nn.Module) -> bool:
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def compile_kwargs(plugin: TorchDynamoPlugin, *, default_backend: str) -> dict[str, Any]:
    """`torch.compile`'s keyword arguments for `plugin` (`backend` "default" becomes `default_backend`)."""
    backend = default_backend if plugin.backend in ("default", None) else plugin.backend
    kwargs: dict[str, Any] = {"backend": backend, "fullgraph": plugin.fullgraph, "dynamic": plugin.dynamic}
    if plugin.mode is not None:
        kwargs["mode"] = plugin.mode
    if plugin.options is not None:
        kwargs["options"] = plugin.options
    return kwargs


def compile_settings(adapter: Adapter, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin | None:
    """The compile settings a run on `adapter` uses for the user's `plugin` (None: no compilation), with
    the backend resolved ("default" is the adapter's `compile_backend()`).

    Raises:
        CompileNotSupportedError: the adapter cannot compile (`Capabilities.compile` is False), or the
            backend is not one the adapter runs (`Adapter.compile_backends`); the message names the adapter.
    """
    settings = adapter.dynamo_settings(plugin)
    if settings is None or settings.backend in (None, "no"):
        return None
    backend = adapter.compile_backend() if settings.backend == "default" else settings.backend
    if not adapter.capabilities.compile:
        raise CompileNotSupportedError(
            f"The {adapter.name!r} adapter does not run torch.compile (dynamo_backend={settings.backend!r} was asked "
            "for). Drop dynamo_backend / --dynamo_backend (or set it to 'no'), or use an adapter that compiles."
        )
    runs = adapter.compile_backends
    if runs is not None and backend not in runs:
        raise CompileNotSupportedError(
            f"The {adapter.name!r} adapter does not run the torch.compile backend {backend!r}; it runs "
            f"{sorted(runs)}. Use dynamo_backend='default' (its own, {adapter.compile_backend()!r}) or one of those."
        )
    return dataclasses.replace(settings, backend=backend)


def compile_model(
    model: torch.nn.Module,
    plugin: TorchDynamoPlugin,
    *,
    default_backend: str,
    in_place: bool = False,
    regions: Callable[..., torch.nn.Module] | None = None,
) -> torch.nn.Module:
    """Compile `model` with `plugin`'s settings unless it is already compiled (whole, or region by region).

    With `use_regional_compilation`, Accelerate's regional compilation: `regions` (the adapter's
    `compile_regions`; default this module's), or with `in_place`
    (a strategy whose hooks sit on the model's modules, `Strategy.compiles_regions_in_place`: FSDP2)
    `compile_regions_in_place` with dynamo capturing scalar outputs and skipping the forward's side effects
    when checkpointed blocks recompute (Accelerate's FSDP2 settings, process-wide as there).
    """
    if is_compiled_module(model) or "_orig_mod" in model.__dict__:
        return model
    kwargs = compile_kwargs(plugin, default_backend=default_backend)
    if not plugin.use_regional_compilation:
        return cast(torch.nn.Module, torch.compile(model, **kwargs))
    if not in_place:
        return (regions or compile_regions)(model, **kwargs)
    # Data-dependent shapes (MoE token dispatch) and activation checkpointing around compiled blocks.
    torch._dynamo.config.capture_scalar_outputs = True
    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    compile_regions_in_place(model, **kwargs)
    return model


def is_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether `module` is a region list: a non-empty `ModuleList` whose blocks all share the first one's class."""
    return (
        isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and all(isinstance(block, type(module[0])) for block in module)
    )


def has_repeated_blocks(module: torch.nn.Module) -> bool:
    """Whether `module` holds a region list (`is_repeated_blocks`) at any depth."""
    return bool(module._modules) and any(is_repeated_blocks(m) for m in module.modules())


def compile_regions(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """Accelerate's regional compilation: each block of a repeated `ModuleList` is compiled on its own (identical
    blocks reuse the compiled code, so a deep model compiles in the time of one block), and every subtree
    without repeated blocks is compiled as one region; a model without any is compiled whole.

    Returns a new module sharing `model`'s parameters, with `model` itself, unchanged, in `_orig_mod` (where
    `unwrap_model(..., keep_torch_compile=False)` and state dicts find it).
    """
    compiled = _compile_regions(model, kwargs)
    if not is_compiled_module(compiled):
        compiled.__dict__["_orig_mod"] = model  # not a submodule: parameters are not listed twice
    return compiled


def _compile_regions(module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.nn.Module:
    if is_repeated_blocks(module):
        blocks = cast(torch.nn.ModuleList, module)
        return torch.nn.ModuleList(cast(torch.nn.Module, torch.compile(block, **kwargs)) for block in blocks)
    if not has_repeated_blocks(module):
        return cast(torch.nn.Module, torch.compile(module, **kwargs))
    # A shallow copy whose children are compiled regions: the user's module keeps its own children.
    copy = module.__class__.__new__(module.__class__)
    copy.__dict__.update(module.__dict__)
    for name, value in list(copy.__dict__.items()):
        if isinstance(value, MethodType) and value.__self__ is module:  # methods bound to it follow the copy
            copy.__dict__[name] = MethodType(value.__func__, copy)
    copy._modules = {}
    for name, child in module.named_children():
        copy.add_module(name, _compile_regions(child, kwargs))
    return copy


def compile_regions_in_place(model: torch.nn.Module, **kwargs: Any) -> None:
    """Regional compilation with `module.compile(**kwargs)`, keeping every module object: each block of a
    repeated `ModuleList`, and every subtree without repeated blocks (the model itself when it has none).

    For a model whose wrapper put hooks on its modules (FSDP2's `fully_shard`, a DeepSpeed engine): a
    `torch.compile` wrapper in their place would leave the hooks behind, and rename every parameter.
    """
    if is_repeated_blocks(model):
        for block in cast(torch.nn.ModuleList, model):
            block.compile(**kwargs)
    elif has_repeated_blocks(model):
        for child in model.children():
            compile_regions_in_place(child, **kwargs)
    else:
        model.compile(**kwargs)


def strip_compile(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a `torch.compile` wrapper (the module itself when not compiled)."""
    return getattr(model, "_orig_mod", model)


def unwrap_through(model: torch.nn.Module, strategy: Any, *, keep_torch_compile: bool = True) -> torch.nn.Module:
    """`model` out of every `strategy` wrapper, and out of compile wrappers unless `keep_torch_compile`.

    A compiled strategy wrapper is no user module: it is always looked through.
    """
    inner = model
    while True:
        regional = None if is_compiled_module(inner) else inner.__dict__.get("_orig_mod")
        if regional is not None and not keep_torch_compile:
            inner = regional  # the module `compile_regions` copied, as it was
            continue
        nxt = strategy.unwrap(inner)
        if nxt is inner and is_compiled_module(inner):
            orig: torch.nn.Module = inner._orig_mod  # type: ignore[assignment]
            if not keep_torch_compile or strategy.unwrap(orig) is not orig:
                nxt = orig
        if nxt is inner:
            return inner
        inner = nxt


# ---- the prepared optimizer ------------------------------------------------------------------------
class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps a user's optimizer.

    `step()` and `zero_grad()` act only on steps where `sync_gradients` is True (the last
    micro-batch of an accumulation), go through the fp16 grad scaler when there is one, and
    let the adapter run its optimizer step. `step_was_skipped` tells whether the last step
    was skipped because the scaler found inf/nan gradients.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        device_placement: bool = True,
        scaler: Any = None,
        *,
        adapter: Any = None,
        device: torch.device | None = None,
        precision: Precision | None = None,
        before_step: Callable[[torch.optim.Optimizer], None] | None = None,
        keep_gradients: bool = False,
    ) -> None:
        # No super().__init__: this object is a view on `optimizer`, sharing its param_groups
        # and state, so code that reads them (schedulers, loggers) sees the real ones.
        self.optimizer = optimizer
        # The run's precision steps it (Accelerate's signature, `scaler=`, still builds one).
        if precision is None:
            precision = Precision("fp16" if scaler is not None else "no", adapter, scaler=scaler)
        self.precision = precision
        self.scaler = precision.scaler
        self.before_step: Callable[[torch.optim.Optimizer], None] | None = before_step
        """The strategy's `before_optimizer_step` when it has one (None otherwise: nothing runs per step)."""
        self.adapter = adapter
        self.keep_gradients = keep_gradients
        """`zero_grad()`'s default: zero in place (the strategy's `keeps_gradients`) instead of setting to None."""
        self.gradient_state = GradientState()
        self.device_placement = device_placement
        self._scale_before: torch.Tensor | None = None
        self._accelerate_step_called = False
        if device_placement and device is not None and optimizer.state:
            state = optimizer.state_dict()
            optimizer.load_state_dict(send_to_device(state, device))

    # The optimizer's own attributes are the truth; read them through.
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Clear the gradients on steps that sync; `set_to_none` None: True (torch's default) unless the
        strategy keeps gradient tensors (`Strategy.keeps_gradients`)."""
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=not self.keep_gradients if set_to_none is None else set_to_none)

    def train(self) -> None:
        """For optimizers with train/eval modes (schedule-free ones)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if not self.gradient_state.sync_gradients:
            return None
        self._accelerate_step_called = True
        if self.before_step is not None:
            self.before_step(self.optimizer)
        result, self._scale_before = self.precision.step(self.optimizer, closure)
        if self.adapter is not None:
            self.adapter.after_optimizer_step()
        return result

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last `step()` was skipped because gradients overflowed (fp16): by the run's grad scaler,
        or by the engine of a strategy that scales the loss itself (its optimizer's own `step_was_skipped`)."""
        if getattr(self.optimizer, "step_was_skipped", False) is True:
            return True
        return self.precision.step_was_skipped(self._scale_before)

    @property
    def is_overflow(self) -> bool:
        return self.step_was_skipped

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({self.optimizer!r})"


# ---- the prepared scheduler ------------------------------------------------------------------------
class AcceleratedScheduler:
    """Wraps a scheduler so it follows the optimizer.

    On accumulation steps it does not step (only its counter moves when the accumulation
    plugin's `adjust_scheduler` is set); after an fp16 step skipped for overflow it does not
    step; and without `split_batches` it steps once per process, so a schedule written for
    one process covers the same number of samples on many.
    """

    def __init__(
        self,
        scheduler: Any,
        optimizers: Any,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
        num_data_shards: int | None = None,
    ) -> None:
        self.scheduler = scheduler
        # Processes that read different batches (fewer than all when a strategy splits each
        # model over several processes); None: every process.
        self.num_data_shards = num_data_shards
        self.optimizers = optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.gradient_state = GradientState()

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.gradient_state.sync_gradients:
            if self.gradient_state.adjust_scheduler:
                self.scheduler._step_count += 1
            return
        if any(getattr(opt, "step_was_skipped", False) for opt in self.optimizers):
            return
        # Accelerate's signature has no `num_data_shards`: built by hand, the wrapper counts every process.
        shards = self.num_data_shards or (dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)
        times = 1 if self.split_batches else shards
        for _ in range(times):
            total = getattr(self.scheduler, "total_steps", None)
            # OneCycleLR raises past total_steps; a last partial batch can push it there.
            if total is None or self.scheduler._step_count <= total:
                self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()  # type: ignore[no-any-return]

    def get_lr(self) -> Any:
        return self.scheduler.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def print_lr(self, *args: Any, **kwargs: Any) -> Any:
        return self.scheduler.print_lr(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "scheduler" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["scheduler"], name)


def follow_replaced_optimizer(scheduler: Any, old: Any, new: Any) -> None:
    """Point a torch scheduler built on optimizer `old` at its replacement `new`.

    A strategy or adapter may hand back a new optimizer from `prepare` (a vendor's fused
    optimizer, an engine's wrapper). A scheduler built before `prepare` still holds the old
    one: it would report its schedule while the new optimizer trains at the base rate. Each
    group's current and initial learning rate (and the other values a scheduler writes, e.g.
    momentum) move to the new optimizer's matching group, and `new.step` is tracked the way
    the scheduler tracked `old.step`, so torch's step-order check keeps working.

    Raises:
        ValueError: the two optimizers have different numbers of parameter groups.
    """
    if len(old.param_groups) != len(new.param_groups):
        raise ValueError(
            f"The prepared optimizer replacing {type(old).__name__} has {len(new.param_groups)} parameter groups, "
            f"the original {len(old.param_groups)}: its scheduler cannot follow it. An adapter or strategy that "
            "replaces an optimizer must keep its parameter groups."
        )
    scheduled = ("lr", "initial_lr", "momentum", "betas", "max_lr", "min_lr", "max_momentum", "base_momentum")
    for before, after in zip(old.param_groups, new.param_groups):
        for key in scheduled:
            if key in before:
                after[key] = before[key]
    scheduler.optimizer = new
    _track_step_calls(new)


def _track_step_calls(optimizer: Any) -> None:
    step = optimizer.step
    if getattr(step, "_wrapped_by_lr_sched", False):
        return

    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked
