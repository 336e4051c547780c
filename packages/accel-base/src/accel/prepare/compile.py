"""`torch.compile`, applied last and only once; whole-model or one block at a time."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

import torch

from ..errors import CompileNotSupportedError
from ..settings.kwargs import TorchDynamoPlugin

if TYPE_CHECKING:
    from ..adapter.base import Adapter


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


def compile_model(model: torch.nn.Module, plugin: TorchDynamoPlugin, *, default_backend: str) -> torch.nn.Module:
    """Compile `model` with `plugin`'s settings unless it is already compiled.

    With `use_regional_compilation`, every child of every `ModuleList` is compiled in place
    (each repeated block compiles once, and identical blocks reuse the code) and the model
    object itself is returned.
    """
    if is_compiled_module(model):
        return model
    kwargs = compile_kwargs(plugin, default_backend=default_backend)
    if plugin.use_regional_compilation:
        return compile_regions(model, **kwargs)
    return cast(torch.nn.Module, torch.compile(model, **kwargs))


def compile_regions(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """Compile each block held in a `ModuleList` in place; returns `model` (marked compiled)."""
    found = False
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            for i, block in enumerate(module):
                if not is_compiled_module(block):
                    module[i] = cast(torch.nn.Module, torch.compile(block, **kwargs))
                    found = True
    if not found:
        # No repeated blocks: whole-model compilation is the only sensible region.
        return cast(torch.nn.Module, torch.compile(model, **kwargs))
    model._accel_regionally_compiled = True  # type: ignore[assignment]
    return model


def compile_regions_in_place(model: torch.nn.Module, **kwargs: Any) -> None:
    """`module.compile(**kwargs)` on each block held in a `ModuleList` (else on `model` itself).

    In place, keeping every module object: for a model already inside an engine (DeepSpeed) whose hooks
    sit on those modules, where swapping in `torch.compile` wrappers would leave the hooks behind.
    """
    blocks = [block for m in model.modules() if isinstance(m, torch.nn.ModuleList) for block in m]
    for block in blocks or [model]:
        block.compile(**kwargs)


def strip_compile(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a `torch.compile` wrapper (the module itself when not compiled)."""
    return getattr(model, "_orig_mod", model)


def unwrap_through(model: torch.nn.Module, strategy: Any, *, keep_torch_compile: bool = True) -> torch.nn.Module:
    """`model` out of every `strategy` wrapper, and out of compile wrappers unless `keep_torch_compile`.

    A compiled strategy wrapper is no user module: it is always looked through.
    """
    inner = model
    while True:
        nxt = strategy.unwrap(inner)
        if nxt is inner and is_compiled_module(inner):
            orig: torch.nn.Module = inner._orig_mod  # type: ignore[assignment]
            if not keep_torch_compile or strategy.unwrap(orig) is not orig:
                nxt = orig
        if nxt is inner:
            return inner
        inner = nxt
