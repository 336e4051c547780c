"""The prepared optimizer: steps only when gradients are synchronised, through the scaler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..distributed.state import GradientState
from ..distributed.tree import send_to_device
from ..precision.base import Precision


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

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.gradient_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

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
        """Whether the last `step()` was skipped because gradients overflowed (fp16)."""
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
