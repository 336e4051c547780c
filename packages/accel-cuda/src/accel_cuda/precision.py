"""The CUDA adapter's precision: fp8 through TransformerEngine or torchao, as a `Precision` subclass."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from accel.precision.base import Precision, enter_all, wrap_forward_in_autocast

from . import fp8


class CUDAPrecision(Precision):
    """fp8: Linears swapped by the backend the handlers name (`convert_fp8`), the
    forward under bf16 autocast for the layers that stay in high precision, and under
    TransformerEngine's `fp8_autocast` with its recipe (in eval mode only when
    `TERecipeKwargs.use_autocast_during_eval`). Other modes are the core's."""

    def convert_module(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        if self.mode != "fp8":
            return super().convert_module(model, ctx)
        adapter = self.adapter
        model = self.convert_fp8(model, ctx)
        kwargs = ctx.autocast_kwargs
        contexts: list[Any] = [lambda: adapter.autocast("bf16", **kwargs)]
        recipe = getattr(model, "_accel_te_recipe", None)
        if recipe is not None:
            te_kwargs = ctx.handler(fp8.TERecipeKwargs) or fp8.TERecipeKwargs()
            eval_too = te_kwargs.use_autocast_during_eval

            def te_context() -> Any:
                if model.training or eval_too:
                    return adapter.vendor.te_fp8_autocast(recipe)
                return contextlib.nullcontext()

            contexts.append(te_context)
        wrap_forward_in_autocast(model, lambda: enter_all(contexts))
        return model

    def convert_fp8(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        """Swap Linears for fp8 ones with the backend the handlers name, else whichever is installed.
        Converting twice is a no-op.

        Raises:
            accel_cuda.fp8.FP8BackendError: neither TransformerEngine nor torchao is installed
                (the message names both), the named one is not, or the GPU has no fp8.
        """
        if getattr(model, "_accel_fp8_backend", None) is not None:
            return model
        te_kwargs = ctx.handler(fp8.TERecipeKwargs)
        ao_kwargs = ctx.handler(fp8.AORecipeKwargs)
        backend = fp8.choose_backend(self.adapter.vendor, te_kwargs, ao_kwargs)
        with torch.no_grad():
            if backend == "te":
                fp8.convert_te(model, self.adapter.vendor)
                model._accel_te_recipe = (te_kwargs or fp8.TERecipeKwargs()).recipe(self.adapter.vendor)
            else:
                ao_kwargs = ao_kwargs or fp8.AORecipeKwargs()
                keep = ao_kwargs.module_filter_func or fp8.default_ao_filter(model)
                self.adapter.vendor.ao_convert(model, ao_kwargs.config, keep)
        model._accel_fp8_backend = backend  # type: ignore[assignment]
        return model
