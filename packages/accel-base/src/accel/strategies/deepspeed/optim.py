"""DeepSpeed's view of the user's optimizer: Accelerate's mapping onto DeepSpeed's CPU optimizers for
optimizer offload, and the prepared optimizer and scheduler (views on the engine's, stepped by it)."""

from __future__ import annotations

import logging
from typing import Any

import torch


def _is_32bit_bnb(optimizer: Any, names: tuple[str, ...]) -> bool:
    """A bitsandbytes optimizer of one of the class `names` running 32-bit states (Accelerate maps those too)."""
    cls = type(optimizer)
    if not cls.__module__.startswith("bitsandbytes") or cls.__name__ not in names:
        return False
    bits = getattr(optimizer, "optim_bits", None)
    if bits is None:
        bits = getattr(getattr(optimizer, "args", None), "optim_bits", None)
    return bits == 32


def map_pytorch_optim_to_deepspeed(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """DeepSpeed's CPU optimizer in place of a torch one, for optimizer offload (Accelerate's rule).

    Built over the same parameter groups (so per-group `lr`, `betas`, `eps`, `weight_decay`
    carry over), with the optimizer's default `lr` and `weight_decay`:

    - `torch.optim.Adagrad` (or a 32-bit bitsandbytes Adagrad) becomes `DeepSpeedCPUAdagrad`;
    - a 32-bit bitsandbytes Lion becomes `DeepSpeedCPULion`;
    - every other optimizer becomes `DeepSpeedCPUAdam`, with decoupled weight decay
      (`adamw_mode=True`) for `torch.optim.AdamW` (or a 32-bit bitsandbytes AdamW) and L2
      weight decay (`adamw_mode=False`) otherwise. As in Accelerate, that includes SGD and
      other non-Adam optimizers: the update rule changes (a warning says so).
    """
    defaults = {k: v for k, v in optimizer.defaults.items() if k in ("lr", "weight_decay")}
    if isinstance(optimizer, torch.optim.Adagrad) or _is_32bit_bnb(optimizer, ("Adagrad", "Adagrad32bit")):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

        # Accelerate 1.15 also passes `adamw_mode` here, which DeepSpeedCPUAdagrad (0.19) does not accept.
        return DeepSpeedCPUAdagrad(optimizer.param_groups, **defaults)  # type: ignore[no-any-return]
    if _is_32bit_bnb(optimizer, ("Lion", "Lion32bit")):
        from deepspeed.ops.lion import DeepSpeedCPULion

        return DeepSpeedCPULion(optimizer.param_groups, **defaults)  # type: ignore[no-any-return]
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    adamw = isinstance(optimizer, torch.optim.AdamW) or _is_32bit_bnb(optimizer, ("AdamW", "AdamW32bit"))
    if not adamw and not isinstance(optimizer, torch.optim.Adam):
        logging.getLogger("accel").warning(
            "Optimizer offload under DeepSpeed replaces %s with DeepSpeedCPUAdam (Adam with L2 weight decay), as "
            "Accelerate does: the update rule changes. Set the DeepSpeed config's `zero_force_ds_cpu_optimizer` "
            "to false to keep your optimizer.",
            type(optimizer).__name__,
        )
    return DeepSpeedCPUAdam(optimizer.param_groups, adamw_mode=adamw, **defaults)  # type: ignore[no-any-return]


class DeepSpeedOptimizerWrapper(torch.optim.Optimizer):
    """The optimizer inside the prepared one: a view on the engine's optimizer.

    `step` and `zero_grad` do nothing because `Accelerator.backward` already ran the
    engine's step, which steps and zeroes at each accumulation boundary.
    """

    def __init__(self, optimizer: Any) -> None:
        # No super().__init__: a view, sharing the real optimizer's groups and state.
        self.optimizer = optimizer

    @property
    def state(self) -> Any:  # type: ignore[override]
        return getattr(self.optimizer, "state", {})

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups  # type: ignore[no-any-return]

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return getattr(self.optimizer, "defaults", {})

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        return None

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        return None

    @property
    def step_was_skipped(self) -> bool:
        """Whether the engine skipped its last step: its optimizer's `overflow` (fp16 loss scaling found inf/nan
        gradients), as Accelerate's wrapper reports it."""
        return bool(getattr(self.optimizer, "overflow", False))

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"DeepSpeedOptimizerWrapper({self.optimizer!r})"


class DeepSpeedSchedulerWrapper:
    """The scheduler inside the prepared one: the engine steps the real one with each optimizer step."""

    in_engine_checkpoint = True  # DeepSpeed's engine checkpoint holds its state too

    def __init__(self, scheduler: Any, optimizer: Any) -> None:
        self.scheduler = scheduler
        self.optimizer = optimizer
        # The prepared scheduler counts accumulation steps here (`adjust_scheduler`); the engine steps the
        # real scheduler at each boundary, so this counter moves nothing.
        self._step_count = 0

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()  # type: ignore[no-any-return]

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)
