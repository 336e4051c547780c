"""Mixed precision around a model's forward: autocast in, fp32 out.

The forward runs under the adapter's autocast; floating outputs in half precision are
converted back to fp32 so losses and metrics computed outside the model stay in fp32.
The original forward is kept as `model._original_forward` and restored by
`unwrap_model(keep_fp32_wrapper=False)`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..distributed.tree import recursively_apply


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def convert_outputs_to_fp32(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `forward` so its half-precision floating outputs come back as fp32."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return recursively_apply(_to_fp32, forward(*args, **kwargs))

    wrapped.__wrapped_fp32__ = True  # type: ignore[attr-defined]
    return wrapped


def wrap_forward_in_autocast(
    model: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager[Any]]
) -> None:
    """Run `model.forward` under a fresh `autocast()` context and return fp32 outputs.

    Keeps the original as `model._original_forward`.
    """
    if getattr(model.forward, "__wrapped_fp32__", False):
        return
    original = model.forward
    model._original_forward = original  # type: ignore[assignment]
    autocast_forward = _autocast_decorator(autocast)(original)
    model.forward = convert_outputs_to_fp32(autocast_forward)  # type: ignore[method-assign]


def _autocast_decorator(
    make_ctx: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            # A fresh context per call: an autocast object keeps its previous state on
            # itself, so sharing one breaks under re-entrant forwards.
            with make_ctx():
                return fn(*args, **kwargs)

        return inner

    return decorate


@contextlib.contextmanager
def enter_all(factories: list[Callable[[], contextlib.AbstractContextManager[Any]]]) -> Iterator[None]:
    """Enter a fresh context from each factory, in order (a forward under several precision contexts)."""
    with contextlib.ExitStack() as stack:
        for make in factories:
            stack.enter_context(make())
        yield


def in_training_or(
    model: torch.nn.Module, eval_too: bool, make: Callable[[], contextlib.AbstractContextManager[Any]]
) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A context factory for `enter_all`: `make()` while `model` trains, and in evaluation too when `eval_too`
    (Accelerate's `use_autocast_during_eval` for an fp8 autocast); no context otherwise."""

    def factory() -> contextlib.AbstractContextManager[Any]:
        return make() if model.training or eval_too else contextlib.nullcontext()

    return factory


def remove_autocast_wrapper(model: torch.nn.Module) -> None:
    """Undo `wrap_forward_in_autocast`."""
    original = model.__dict__.pop("_original_forward", None)
    if original is not None:
        model.forward = original  # type: ignore[method-assign]


_NOT_SET = object()


PRECISION_MODES = ("no", "bf16", "fp16", "fp8")
"""The mixed-precision modes a run can ask for (`Accelerator(mixed_precision=...)`); also `accel.adapter.PRECISIONS`."""


class Precision:
    """The run's mixed precision, one object per Accelerator: the forward context, the fp16 loss
    scaling, unscaling, and the optimizer step (through the scaler and the adapter's own step).

    Built by `Precision.for_run` from the adapter's precision hooks (`autocast`,
    `make_grad_scaler`, `optimizer_step`); an adapter with its own precision (an fp8 backend and
    its recipe context and layers, a vendor scaler) subclasses it and names the subclass in
    `Adapter.precision_class`. `convert_module` is the prepare walk's precision step
    (`accel.prepare.walk`); the adapter never calls it.
    """

    def __init__(
        self, mode: str, adapter: Any, *, scaler: Any = None, autocast_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.mode = mode
        self.adapter = adapter
        self.scaler = scaler
        """The fp16 grad scaler (None: no loss scaling, or the strategy's engine scales)."""
        self.autocast_kwargs = dict(autocast_kwargs or {})
        # Whether the adapter replaces the optimizer step (fp16 steps then go through it too).
        self.vendor_step = adapter is not None and adapter.has_own_optimizer_step()

    @classmethod
    def resolve(cls, requested: str | None, adapter: Any) -> str:
        """The mode a run uses: `requested` (None: "no"), checked against `PRECISION_MODES` and the adapter.
        When the device cannot run it (`Adapter.precision_fallback`: fp8 on hardware without fp8 units), the
        adapter's fallback mode, with its warning logged, as Accelerate does.

        Raises:
            ValueError: an unknown mode, or one the adapter does not support (says which it does).
        """
        mode = (requested or "no").lower()
        if mode not in PRECISION_MODES:
            raise ValueError(f"mixed_precision must be one of 'no', 'bf16', 'fp16', 'fp8', got {mode!r}.")
        fallback = adapter.precision_fallback(mode) if hasattr(adapter, "precision_fallback") else None
        if fallback is not None:
            mode, message = fallback
            logging.getLogger("accel").warning(message)
        if not adapter.supports_precision(mode):
            supported = sorted(adapter.capabilities.precisions)
            raise ValueError(
                f"The {adapter.name!r} adapter does not support mixed_precision={mode!r}; "
                f"it supports {supported}. Pick one of those or install an adapter that supports {mode!r}."
            )
        return mode

    @classmethod
    def for_run(
        cls,
        mode: str,
        adapter: Any,
        *,
        loss_scaling: bool = True,
        scaler_kwargs: dict[str, Any] | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> Precision:
        """The precision of a run on `adapter`; `loss_scaling=False` when a strategy's engine scales itself."""
        kind = getattr(adapter, "precision_class", None) or cls
        scaler = adapter.make_grad_scaler(mode, **(scaler_kwargs or {})) if loss_scaling else None
        return kind(mode, adapter, scaler=scaler, autocast_kwargs=autocast_kwargs)  # type: ignore[no-any-return]

    @classmethod
    def of(cls, adapter: Any, mode: str, autocast_kwargs: dict[str, Any] | None = None) -> Precision:
        """The adapter's precision class for `mode`, without a scaler (module conversion outside a run)."""
        kind = getattr(adapter, "precision_class", None) or cls
        return kind(mode, adapter, autocast_kwargs=autocast_kwargs)  # type: ignore[no-any-return]

    @property
    def fp8(self) -> bool:
        """Whether prepared models get fp8 layers (base: under `mixed_precision="fp8"`; an adapter may convert
        under other modes too, e.g. on its own fp8 option)."""
        return self.mode == "fp8"

    def convert_module(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        """Make a model run in this precision (the walk's precision step, after placement): fp8 layers
        (`convert_fp8`), and a forward under `forward_context` whose half-precision outputs come back as fp32."""
        if self.mode == "fp8":
            model = self.convert_fp8(model, ctx)
        if self.mode in ("bf16", "fp16"):
            kwargs = ctx.autocast_kwargs
            wrap_forward_in_autocast(model, lambda: self.forward_context(kwargs))
        return model

    def convert_fp8(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        """Swap the model's layers for fp8 ones. An adapter that claims "fp8" names a precision class that
        overrides this; the base runs a contract-1/2 adapter's own `convert_to_fp8` (deprecated), which
        raises NotImplementedError for an adapter without fp8."""
        return self.adapter.convert_to_fp8(model, ctx)  # type: ignore[no-any-return]

    def forward_context(self, autocast_kwargs: dict[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
        """The context a forward runs in (the adapter's autocast for bf16/fp16; a null context otherwise)."""
        kwargs = self.autocast_kwargs if autocast_kwargs is None else autocast_kwargs
        return self.adapter.autocast(self.mode, **kwargs)  # type: ignore[no-any-return]

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to run backward on (multiplied by the fp16 scale)."""
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients `optimizer` holds by the loss scale (once per step; no-op without a scaler)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> tuple[Any, torch.Tensor | None]:
        """One optimizer step; returns (its result, the loss scale before it, or None without a scaler).

        Under fp16 the scaler steps (skipping on inf/nan gradients) and updates its scale; an
        adapter's own `optimizer_step` (a vendor's fused update) runs inside the scaler's step,
        so loss scaling and a vendor step compose. The scale is not read here: comparing it
        (`step_was_skipped`) would synchronise with the device on every step.
        """
        if self.scaler is None:
            if self.adapter is not None:
                return self.adapter.optimizer_step(optimizer, closure), None
            return (optimizer.step(closure) if closure is not None else optimizer.step()), None
        scale = self.scaler._scale
        before = scale.clone() if scale is not None else None
        result = self._scaled_step(optimizer, closure)
        self.scaler.update()
        return result, before

    def _scaled_step(self, optimizer: torch.optim.Optimizer, closure: Any) -> Any:
        scaler = self.scaler
        if not self.vendor_step:
            return scaler.step(optimizer, closure) if closure is not None else scaler.step(optimizer)
        own = optimizer.__dict__.get("step", _NOT_SET)  # e.g. a scheduler's step-tracking wrapper

        def vendor_step(*args: Any, **kwargs: Any) -> Any:
            _restore_step(optimizer, own)
            return self.adapter.optimizer_step(optimizer, closure)

        optimizer.step = vendor_step  # type: ignore[method-assign]
        try:
            return scaler.step(optimizer)
        finally:
            _restore_step(optimizer, own)

    def step_was_skipped(self, scale_before: torch.Tensor | None) -> bool:
        """Whether the step that started at `scale_before` was skipped (the scaler lowered its scale)."""
        if self.scaler is None or scale_before is None or self.scaler._scale is None:
            return False
        return bool((self.scaler._scale < scale_before).item())


def _restore_step(optimizer: torch.optim.Optimizer, own: Any) -> None:
    if own is _NOT_SET:
        optimizer.__dict__.pop("step", None)
    else:
        optimizer.step = own  # type: ignore[method-assign]


def precision_of(ctx: Any) -> Precision:
    """The run's precision (`ctx.precision`, a `RunContext`'s), or the adapter's precision class for the mode
    outside a run (a context built by hand)."""
    if ctx.precision is not None:
        return ctx.precision  # type: ignore[no-any-return]
    return Precision.of(ctx.adapter, ctx.mixed_precision, ctx.autocast_kwargs)
