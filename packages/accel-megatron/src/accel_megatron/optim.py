"""The user's torch optimizer and scheduler, rebuilt as megatron-core's with the same hyperparameters."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from .plugin import MegatronConfigError, MegatronPlugin
from .tensorboard import TensorBoardLog

_SCHEDULER_HELP = (
    "Use LinearLR (warmup or linear decay), CosineAnnealingLR, ConstantLR with factor=1, or build a "
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler on the prepared optimizer yourself."
)


def optimizer_config(optimizer: torch.optim.Optimizer, plugin: MegatronPlugin, mixed_precision: str = "no") -> Any:
    """megatron-core's `OptimizerConfig` for the hyperparameters of `optimizer`.

    `mixed_precision` "bf16"/"fp16" selects megatron-core's mixed-precision optimizer (fp32
    main parameters; fp16 with its dynamic loss scaler).

    Raises:
        MegatronConfigError: an optimizer type megatron-core has no counterpart for, or
            param groups with different hyperparameters.
    """
    from megatron.core.optimizer import OptimizerConfig

    groups = optimizer.param_groups
    keys = ("lr", "weight_decay", "betas", "eps", "momentum")
    first: dict[str, Any] = {k: groups[0].get(k) for k in keys}
    if any({k: g.get(k) for k in keys} != first for g in groups[1:]):
        raise MegatronConfigError(
            "megatron-core's optimizer takes one set of hyperparameters; the optimizer's param groups differ. "
            "Use one param group (megatron-core itself exempts biases and norm weights from weight decay)."
        )
    # A torch scheduler built before prepare has already moved `lr`; its base is `initial_lr`.
    common: dict[str, Any] = {
        "lr": float(groups[0].get("initial_lr", first["lr"])),
        "min_lr": 0.0,
        "weight_decay": float(first["weight_decay"] or 0.0),
        "use_distributed_optimizer": plugin.use_distributed_optimizer,
        # megatron-core clips at 1.0 unless told otherwise; the user asked for what the plugin says.
        "clip_grad": float(plugin.gradient_clipping or 0.0),
        "bf16": mixed_precision == "bf16",
        "fp16": mixed_precision == "fp16",
        # CUDA-only (refused elsewhere by MegatronPlugin.validate): megatron-core's own fields.
        "optimizer_cpu_offload": plugin.optimizer_cpu_offload,
        "use_precision_aware_optimizer": plugin.use_precision_aware_optimizer,
        "overlap_cpu_optimizer_d2h_h2d": plugin.overlap_cpu_optimizer_d2h_h2d,
        "log_num_zeros_in_grad": bool(plugin.tensorboard_dir and plugin.set_all_logging_options),
    }
    if isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam)):
        defaults = optimizer.defaults
        unsupported = [k for k in ("amsgrad", "maximize") if defaults.get(k)]
        if unsupported:
            raise MegatronConfigError(f"megatron-core's Adam has no {unsupported}; turn them off.")
        beta1, beta2 = first["betas"]
        return OptimizerConfig(
            optimizer="adam",
            adam_beta1=float(beta1),
            adam_beta2=float(beta2),
            adam_eps=float(first["eps"]),
            # torch's Adam adds weight decay to the gradient (L2); AdamW decouples it.
            decoupled_weight_decay=isinstance(optimizer, torch.optim.AdamW) or not common["weight_decay"],
            **common,
        )
    if isinstance(optimizer, torch.optim.SGD):
        defaults = optimizer.defaults
        if defaults.get("nesterov") or defaults.get("dampening"):
            raise MegatronConfigError("megatron-core's SGD has no nesterov or dampening; turn them off.")
        return OptimizerConfig(optimizer="sgd", sgd_momentum=float(first["momentum"] or 0.0), **common)
    raise MegatronConfigError(
        f"megatron-core has no counterpart for {type(optimizer).__name__}; use torch.optim.Adam, AdamW or SGD."
    )


class StepDriver:
    """Who runs the optimizer step: the user's loop, or `model(**batch)`.

    A Hugging Face model prepared under the megatron strategy runs Accelerate's Megatron-LM engine when it is
    called with its keyword batch in training mode: zero the gradients, forward and backward through megatron-core's
    schedule, the optimizer step and the scheduler step. From then on the user's `optimizer.step()`,
    `optimizer.zero_grad()`, `scheduler.step()` and `accelerator.backward(loss)` do nothing, as in Accelerate
    (`MegatronLMOptimizerWrapper`, `MegatronLMSchedulerWrapper`).
    """

    def __init__(self) -> None:
        self.model_driven = False
        """Set by the first training call `model(**batch)`; it stays for the run, as in Accelerate."""
        self.inside = False
        """True while `model(**batch)` itself steps (its calls act)."""

    def skips(self) -> bool:
        """Whether a call from the user's loop is a no-op (the model already ran it)."""
        return self.model_driven and not self.inside

    @contextlib.contextmanager
    def driving(self) -> Iterator[None]:
        """The model's own step: the optimizer and scheduler calls inside act."""
        self.model_driven = self.inside = True
        try:
            yield
        finally:
            self.inside = False


class MegatronOptimizer(torch.optim.Optimizer):
    """A torch-optimizer view of megatron-core's optimizer, for the Accelerator's loop.

    `step()` finishes the data-parallel gradient reduction of megatron-core's DDP, then
    steps megatron-core's optimizer (clipping, distributed-optimizer parameter gather);
    `zero_grad()` clears DDP's contiguous gradient buffers. `inner` is megatron-core's
    optimizer.
    """

    def __init__(self, inner: Any, models: list[torch.nn.Module], redirect: Any, logger: Any = None) -> None:
        # No super().__init__: like AcceleratedOptimizer, this is a view sharing param_groups.
        self.inner = inner
        self.models = models
        self._redirect = redirect
        self._logger = logger
        self.log_losses = False
        """Set by the strategy under `tensorboard_dir`: keep the step's losses for "lm loss"."""
        self.losses: list[torch.Tensor] = []
        """This step's backward losses (divided by the accumulation steps already: their sum is the step's
        mean loss)."""
        self.schedule_losses: list[torch.Tensor] = []
        """This step's `train_step` mean losses."""
        self.defaults: dict[str, Any] = {}
        self.grad_norm: float | None = None
        """Global gradient norm of the last step (over every model-parallel shard)."""
        self.iteration = 0
        """Optimizer steps taken (the x axis of the TensorBoard scalars)."""
        self.step_was_skipped = False
        """Whether the last step was skipped (fp16 gradients overflowed); the scheduler does not step then."""
        self.driver = StepDriver()
        """The strategy's (shared with it): under `model(**batch)` (Accelerate's Megatron-LM engine) the user's calls
        are no-ops."""
        # Set by clip_grad_norm_: gradients already reduced, copied to the main parameters and unscaled.
        self._ready: tuple[bool, float] | None = None

    def _chained(self) -> list[Any]:
        return list(getattr(self.inner, "chained_optimizers", [self.inner]))

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip the global gradient norm (over every tensor-, pipeline- and data-parallel shard) to
        `max_norm` through megatron-core's optimizer, as its own `clip_grad` does; returns the norm
        before clipping (inf when fp16 gradients overflowed: the step is then skipped).

        The data-parallel reduction, the copy to the main parameters and fp16 unscaling happen here
        (megatron-core's `prepare_grads`); the following `step()` goes on from there.
        """
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        with self._redirect():
            if self._ready is None:
                _finalize_grads(self.models)
                found_inf = bool(self.inner.prepare_grads())
                self._ready = (found_inf, 0.0)
            if self._ready[0]:
                return torch.tensor(float("inf"))
            norm = float(self.inner.get_grad_norm())
            for opt in self._chained():
                params = opt.get_parameters()
                if params and not getattr(opt, "is_stub_optimizer", False):
                    decoupled = getattr(opt.config, "use_precision_aware_optimizer_no_fp8_or_ds_fp8", False)
                    clip_grad_by_total_norm_fp32(
                        params, max_norm=max_norm, total_norm=norm, use_decoupled_grad=decoupled
                    )
        self._ready = (False, norm)
        return torch.tensor(norm)

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups  # type: ignore[no-any-return]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.inner.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        # Every torch optimizer's state (several under MoE: dense and expert parameters apart).
        state: dict[Any, Any] = {}
        for opt in self._chained():
            state.update(getattr(getattr(opt, "optimizer", None), "state", {}))
        return state

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("megatron-core's optimizer takes no closure.")
        if self.driver.skips():
            return None  # model(**batch) stepped already (Accelerate's Megatron-LM engine)
        zeros = None
        with self._redirect():
            if self._ready is None:
                _finalize_grads(self.models)
                ok, grad_norm, zeros = self.inner.step()
            else:  # clip_grad_norm_ prepared (and clipped) the gradients already
                found_inf, grad_norm = self._ready
                ok = False if found_inf else self.inner.step_with_ready_grads()
                if found_inf:
                    grad_norm = None
                elif self.inner.config.log_num_zeros_in_grad:
                    zeros = self.inner.count_zeros()
        self._ready = None
        self.step_was_skipped = not ok
        self.grad_norm = None if grad_norm is None else float(grad_norm)
        self.iteration += 1
        loss = self._step_loss()
        if self._logger is not None:
            self._logger.log(self, zeros, loss)
        return ok

    def _step_loss(self) -> float | None:
        """Megatron-LM's "lm loss": the mean of this step's losses, averaged over the data-parallel replicas
        (a collective: every process computes it)."""
        if not self.log_losses:
            return None
        import torch.distributed as dist
        from megatron.core import parallel_state

        backward, scheduled = self.losses, self.schedule_losses
        self.losses, self.schedule_losses = [], []
        if backward:
            mean = torch.stack(backward).sum().reshape(1)
        elif scheduled:
            mean = torch.stack(scheduled).mean().reshape(1)
        else:
            mean = torch.zeros(1)
        group = parallel_state.get_data_parallel_group()
        dist.all_reduce(mean, group=group)
        return float(mean) / dist.get_world_size(group=group) if backward or scheduled else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.driver.skips():
            return  # model(**batch) zeroes them before its step
        self._ready = None
        with self._redirect():
            for model in self.models:
                model.zero_grad_buffer()  # type: ignore[operator]
            self.inner.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        with self._redirect():
            return self.inner.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with self._redirect():
            self.inner.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"MegatronOptimizer({type(self.inner).__name__})"


def build_optimizer(
    optimizer: torch.optim.Optimizer,
    models: list[torch.nn.Module],
    plugin: MegatronPlugin,
    redirect: Any,
    mixed_precision: str = "no",
) -> MegatronOptimizer:
    """megatron-core's optimizer over the DDP-wrapped `models`, from the user's `optimizer`.

    Raises:
        MegatronConfigError: the optimizer updates parameters outside the prepared models.
    """
    from megatron.core.optimizer import get_megatron_optimizer

    owned = {id(p) for m in models for p in m.parameters()}
    stray = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
    if stray:
        raise MegatronConfigError(
            f"The optimizer updates {len(stray)} parameter(s) that belong to no prepared megatron-core model. "
            "Prepare the model first and build the optimizer from `model.parameters()`."
        )
    config = optimizer_config(optimizer, plugin, mixed_precision)
    with redirect():
        inner = get_megatron_optimizer(config, models, config_overrides=param_group_overrides(config, plugin))
    if plugin.scale_lr_cond is not None:
        # megatron-core's scheduler reads each group's max_lr/min_lr; its `lr` starts scaled as well.
        for group in inner.param_groups:
            mult = float(group.get("lr_mult", 1.0))
            group["lr"], group["max_lr"], group["min_lr"] = (config.lr * mult, config.lr * mult, config.min_lr * mult)
    if config.fp16 or config.bf16:
        # As megatron-core's training loop does: its pipeline schedules scale each micro-batch loss.
        for model in models:
            model.config.grad_scale_func = inner.scale_loss  # type: ignore[union-attr]
    built = MegatronOptimizer(inner, models, redirect, TensorBoardLog.create(plugin))
    built.log_losses = plugin.tensorboard_dir is not None
    return built


def param_group_overrides(config: Any, plugin: MegatronPlugin) -> Any:
    """megatron-core's parameter-group overrides for the plugin's `no_wd_decay_cond`, `scale_lr_cond`
    and `lr_mult` (Megatron-LM's `_get_param_groups`): None (megatron-core's default exemption of
    biases and 1-D parameters from weight decay) when neither condition is set."""
    from megatron.core.optimizer import get_standard_config_overrides
    from megatron.core.optimizer.optimizer_config import ParamKey, ParamWithNamePredicate

    no_wd, scale_lr = plugin.no_wd_decay_cond, plugin.scale_lr_cond
    if no_wd is None and scale_lr is None:
        return None
    overrides: dict[Any, Any] = {}
    if no_wd is None:
        overrides.update(get_standard_config_overrides(config))
    else:
        key = ParamKey(with_name_predicate=ParamWithNamePredicate("no_wd_decay_cond", lambda p, n: no_wd(n, p)))
        overrides[key] = {"wd_mult": 0.0}
    if scale_lr is not None:
        key = ParamKey(with_name_predicate=ParamWithNamePredicate("scale_lr_cond", lambda p, n: scale_lr(n, p)))
        overrides[key] = {"lr_mult": float(plugin.lr_mult)}
    return overrides


class MegatronLMDummyScheduler:
    """Accelerate's placeholder: `prepare` replaces it with megatron-core's `OptimizerParamScheduler`
    built from the `MegatronPlugin`'s schedule fields (`lr_decay_style`, `lr_warmup_*`, `min_lr`,
    `weight_decay_incr_style`, ...), as Megatron-LM builds it from its arguments.

    `total_num_steps` and `warmup_num_steps` stand in for `train_iters` and `lr_warmup_iters` when the
    plugin leaves them unset; as in Accelerate they are divided by the data-parallel size.
    """

    def __init__(
        self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(_STAND_IN)

    def get_last_lr(self) -> list[float]:
        raise RuntimeError(_STAND_IN)


_STAND_IN = "MegatronLMDummyScheduler is a stand-in: prepare it with the optimizer to get megatron-core's scheduler."


def plugin_scheduler_args(
    plugin: MegatronPlugin, dummy: MegatronLMDummyScheduler, weight_decay: float, lr: float, data_parallel_size: int
) -> dict[str, Any]:
    """`OptimizerParamScheduler` arguments from the plugin's fields, as Megatron-LM's
    `get_optimizer_param_scheduler` computes them for an iteration-based run (its counts in samples
    are these times the global batch size, which it also steps by: the same schedule).

    Raises:
        MegatronConfigError: no run length, or warmup not shorter than the decay.
    """
    if plugin.train_samples is not None:  # counted in samples, stepped by the global batch size
        train_iters = plugin.train_samples
        decay = plugin.lr_decay_samples or train_iters
        default_warmup = plugin.lr_warmup_samples or 0
    else:
        train_iters = plugin.train_iters  # type: ignore[assignment]
        if train_iters is None:
            if dummy.total_num_steps is None:
                raise MegatronConfigError(
                    "Give the run length: MegatronPlugin(train_iters=...) or (train_samples=...), or "
                    "MegatronLMDummyScheduler(total_num_steps=...)."
                )
            train_iters = dummy.total_num_steps // data_parallel_size
        decay = plugin.lr_decay_iters or train_iters
        default_warmup = (
            plugin.lr_warmup_iters
            if plugin.lr_warmup_iters is not None
            else dummy.warmup_num_steps // data_parallel_size
        )
    fraction = plugin.lr_warmup_fraction
    warmup = fraction * decay if fraction is not None else default_warmup
    if decay <= 0 or warmup >= decay:
        raise MegatronConfigError(
            f"The learning rate must warm up ({warmup} steps) over fewer steps than it decays ({decay}); lower "
            "lr_warmup_iters / lr_warmup_fraction or raise train_iters / lr_decay_iters."
        )
    start = weight_decay if plugin.start_weight_decay is None else plugin.start_weight_decay
    end = weight_decay if plugin.end_weight_decay is None else plugin.end_weight_decay
    return {
        "init_lr": 0.0,
        "max_lr": lr,
        "min_lr": plugin.min_lr,
        "lr_warmup_steps": warmup,
        "lr_decay_steps": decay,
        "lr_decay_style": plugin.lr_decay_style,
        "start_wd": start,
        "end_wd": end,
        "wd_incr_steps": train_iters,
        "wd_incr_style": plugin.weight_decay_incr_style,
        "wsd_decay_steps": plugin.lr_wsd_decay_iters,
        "lr_wsd_decay_style": plugin.lr_wsd_decay_style,
    }


def build_scheduler(scheduler: Any, optimizer: MegatronOptimizer, plugin: MegatronPlugin | None = None) -> Any:
    """megatron-core's `OptimizerParamScheduler` following the same schedule as `scheduler`, or, for a
    `MegatronLMDummyScheduler`, the schedule the plugin's fields describe.

    Raises:
        MegatronConfigError: a scheduler with no megatron-core counterpart.
    """
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from torch.optim import lr_scheduler as ls

    if isinstance(scheduler, OptimizerParamScheduler):
        return scheduler
    plugin = plugin or MegatronPlugin()
    if isinstance(scheduler, MegatronLMDummyScheduler):
        from megatron.core import parallel_state

        config = optimizer.inner.config
        dp = parallel_state.get_data_parallel_world_size()
        return _scheduler(optimizer, plugin_scheduler_args(plugin, scheduler, config.weight_decay, config.lr, dp))
    if plugin.schedule_fields_set():
        raise MegatronConfigError(
            f"The MegatronPlugin's schedule fields {plugin.schedule_fields_set()} describe a "
            "MegatronLMDummyScheduler; prepare accel_megatron.MegatronLMDummyScheduler(optimizer, ...) instead of "
            f"{type(scheduler).__name__}."
        )
    base = float(scheduler.base_lrs[0])
    wd = float(optimizer.inner.config.weight_decay)
    kwargs: dict[str, Any] = {"start_wd": wd, "end_wd": wd, "wd_incr_steps": 1, "wd_incr_style": "constant"}
    args: dict[str, Any]
    if isinstance(scheduler, ls.LinearLR):
        start, end, total = scheduler.start_factor, scheduler.end_factor, scheduler.total_iters
        if end == 1.0:  # warmup from start*lr to lr, then constant
            args = {"init_lr": base * start, "max_lr": base, "min_lr": base, "lr_warmup_steps": total}
            args |= {"lr_decay_steps": total + 1, "lr_decay_style": "constant"}
        elif start == 1.0:  # linear decay from lr to end*lr
            args = {"init_lr": base, "max_lr": base, "min_lr": base * end, "lr_warmup_steps": 0}
            args |= {"lr_decay_steps": total, "lr_decay_style": "linear"}
        else:
            raise MegatronConfigError(
                f"LinearLR from {start} to {end} has no megatron-core counterpart. " + _SCHEDULER_HELP
            )
    elif isinstance(scheduler, ls.CosineAnnealingLR):
        args = {"init_lr": base, "max_lr": base, "min_lr": float(scheduler.eta_min), "lr_warmup_steps": 0}
        args |= {"lr_decay_steps": scheduler.T_max, "lr_decay_style": "cosine"}
    elif isinstance(scheduler, ls.ConstantLR) and math.isclose(scheduler.factor, 1.0):
        args = {"init_lr": base, "max_lr": base, "min_lr": base, "lr_warmup_steps": 0}
        args |= {"lr_decay_steps": 1, "lr_decay_style": "constant"}
    else:
        raise MegatronConfigError(f"{type(scheduler).__name__} has no megatron-core counterpart. " + _SCHEDULER_HELP)
    return _scheduler(optimizer, args | kwargs)


def _scheduler(optimizer: MegatronOptimizer, args: dict[str, Any]) -> Any:
    """The scheduler over every param group, each group's max/min lr times its `lr_mult` (megatron-core
    reads them per group; Megatron-LM's `scale_lr_cond` parameters follow the schedule times lr_mult)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    for group in optimizer.param_groups:
        mult = float(group.get("lr_mult", 1.0))
        group["max_lr"], group["min_lr"] = args["max_lr"] * mult, args["min_lr"] * mult
    return OptimizerParamScheduler(optimizer.inner, **args)


class MegatronScheduler:
    """`OptimizerParamScheduler` with the torch scheduler interface the Accelerator steps."""

    def __init__(self, inner: Any, optimizer: MegatronOptimizer, increment: int = 1) -> None:
        self.inner = inner
        self.optimizer = optimizer
        self.increment = increment
        """What each step adds to the schedule's counter: 1, or the global batch size when the schedule counts
        samples (Megatron-LM's `train_samples`)."""
        # torch schedulers' counter, which the Accelerator advances on accumulation steps.
        self._step_count = 0

    def step(self, *args: Any, **kwargs: Any) -> None:
        if self.optimizer.driver.skips():
            return  # model(**batch) stepped it (Accelerate's Megatron-LM engine)
        self._step_count += 1
        self.inner.step(increment=self.increment)

    def get_last_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        return self.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # megatron-core's scheduler adds the saved step count to its own (it expects a fresh
        # scheduler); resuming a scheduler that has already stepped must start from zero.
        self.inner.num_steps = 0
        self.inner.load_state_dict(state_dict)


def _finalize_grads(models: list[Any]) -> None:
    """megatron-core's gradient finalisation before a step: the data-parallel reduction of every chunk, then the
    all-reduce of a tied word embedding's gradient between the first and last pipeline stages (and of sequence-
    parallel norm gradients), as its training loop does."""
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads

    finalize_model_grads(models)
