"""The user's torch optimizer and scheduler, rebuilt as megatron-core's with the same hyperparameters."""

from __future__ import annotations

import math
from typing import Any

import torch

from .plugin import MegatronConfigError, MegatronPlugin

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


class MegatronOptimizer(torch.optim.Optimizer):
    """A torch-optimizer view of megatron-core's optimizer, for the Accelerator's loop.

    `step()` finishes the data-parallel gradient reduction of megatron-core's DDP, then
    steps megatron-core's optimizer (clipping, distributed-optimizer parameter gather);
    `zero_grad()` clears DDP's contiguous gradient buffers. `inner` is megatron-core's
    optimizer.
    """

    def __init__(self, inner: Any, models: list[torch.nn.Module], redirect: Any) -> None:
        # No super().__init__: like AcceleratedOptimizer, this is a view sharing param_groups.
        self.inner = inner
        self.models = models
        self._redirect = redirect
        self.defaults: dict[str, Any] = {}
        self.grad_norm: float | None = None
        """Global gradient norm of the last step (over every model-parallel shard)."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups  # type: ignore[no-any-return]

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.inner.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return getattr(getattr(self.inner, "optimizer", None), "state", {})

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("megatron-core's optimizer takes no closure.")
        with self._redirect():
            for model in self.models:
                model.finish_grad_sync()  # type: ignore[operator]
            ok, grad_norm, _ = self.inner.step()
        self.grad_norm = None if grad_norm is None else float(grad_norm)
        return ok

    def zero_grad(self, set_to_none: bool = True) -> None:
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
        inner = get_megatron_optimizer(config, models)
    if config.fp16 or config.bf16:
        # As megatron-core's training loop does: its pipeline schedules scale each micro-batch loss.
        for model in models:
            model.config.grad_scale_func = inner.scale_loss  # type: ignore[union-attr]
    return MegatronOptimizer(inner, models, redirect)


def build_scheduler(scheduler: Any, optimizer: MegatronOptimizer) -> Any:
    """megatron-core's `OptimizerParamScheduler` following the same schedule as `scheduler`.

    Raises:
        MegatronConfigError: a scheduler with no megatron-core counterpart.
    """
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from torch.optim import lr_scheduler as ls

    if isinstance(scheduler, OptimizerParamScheduler):
        return scheduler
    base = float(scheduler.base_lrs[0])
    wd = float(optimizer.param_groups[0].get("weight_decay", 0.0))
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
    return OptimizerParamScheduler(optimizer.inner, **args, **kwargs)


class MegatronScheduler:
    """`OptimizerParamScheduler` with the torch scheduler interface the Accelerator steps."""

    def __init__(self, inner: Any, optimizer: MegatronOptimizer) -> None:
        self.inner = inner
        self.optimizer = optimizer
        # torch schedulers' counter, which the Accelerator advances on accumulation steps.
        self._step_count = 0

    def step(self, *args: Any, **kwargs: Any) -> None:
        self._step_count += 1
        self.inner.step(increment=1)

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
