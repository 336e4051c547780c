"""The prepare hooks of adapter contract versions 1 and 2, kept for one minor release.

Version 3 moved the prepare walk into the core (`accel.prepare.walk`). An adapter written for an
earlier version that still defines `prepare_model` or one of its steps (`apply_precision`,
`apply_strategy`, `compile_model`, `convert_to_fp8`) keeps working: the walk calls its
`prepare_model` instead of its own model steps (with a `DeprecationWarning`), and these methods give
the version-2 behaviour to the `super()` calls such an adapter makes. A version-3 adapter that defines
one is refused when adapters are discovered (`accel.adapter.base.LEGACY_PREPARE_HOOKS`).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from ..prepare.context import RunContext

HOOKS = ("prepare_model", "apply_precision", "apply_strategy", "compile_model", "convert_to_fp8")


class LegacyPrepareHooks:
    """Version-2 prepare steps (deprecated): placement, precision, the strategy's `wrap_model`, compilation."""

    if TYPE_CHECKING:  # declared by `Adapter` (a ClassVar there); named here for the methods below
        name: ClassVar[str]

    def prepare_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Version 2's `prepare_model` (deprecated): the walk's steps, in the adapter."""
        if ctx.device_placement:
            model = self.place_model(model, ctx)  # type: ignore[attr-defined]
        model = self.apply_precision(model, ctx)
        if not ctx.evaluation_mode:
            model = self.apply_strategy(model, ctx)
        return self.compile_model(model, ctx)

    def apply_precision(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Version 2's precision step (deprecated): the run's precision converts the model."""
        from ..precision.base import precision_of

        return precision_of(ctx).convert_module(model, ctx)

    def apply_strategy(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Version 2's strategy step (deprecated): `ctx.strategy.wrap_model`."""
        return ctx.strategy.wrap_model(model, ctx)

    def compile_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Version 2's compile step (deprecated): what the walk compiles, with the adapter's settings."""
        from ..prepare.wrappers import compile_model, compile_settings

        settings = compile_settings(ctx.adapter, ctx.dynamo_plugin)
        if settings is None or (ctx.strategy.compiles_model and not ctx.evaluation_mode):
            return model
        return compile_model(model, settings, default_backend=str(settings.backend))

    def convert_to_fp8(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Version 2's fp8 conversion (deprecated; a version-3 adapter's precision class converts)."""
        raise NotImplementedError(f"adapter {self.name!r} does not support fp8")


def legacy_hooks(cls: type) -> list[str]:
    """The version-1/2 prepare hooks `cls` (an adapter class) defines itself."""
    return [name for name in HOOKS if getattr(cls, name, None) is not getattr(LegacyPrepareHooks, name)]


def runs_own_prepare(cls: type) -> bool:
    """Whether the walk calls this adapter's own `prepare_model` (a version-1/2 adapter defining a legacy hook)."""
    return bool(legacy_hooks(cls))


_WARNED: set[type] = set()


def warn_legacy(adapter: Any) -> None:
    """The walk's `DeprecationWarning`, once per adapter class, for an adapter that runs its own `prepare_model`."""
    cls = type(adapter)
    if cls in _WARNED:
        return
    _WARNED.add(cls)
    warnings.warn(
        f"The {adapter.name!r} adapter ({cls.__module__}.{cls.__qualname__}, contract version {adapter.api_version}) "
        f"defines {', '.join(legacy_hooks(cls))}, which version 3 of the adapter contract no longer calls: the "
        "core drives the prepare walk. It runs as before for this minor release; docs/adapters.md ('Versions of "
        "the contract') says what to change.",
        DeprecationWarning,
        stacklevel=5,
    )
