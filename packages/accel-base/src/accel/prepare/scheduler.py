"""The prepared learning-rate scheduler: steps with the optimizer, not with every batch."""

from __future__ import annotations

from typing import Any

from ..distributed.state import AcceleratorState, GradientState


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
        shards = self.num_data_shards or AcceleratorState().num_processes
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
