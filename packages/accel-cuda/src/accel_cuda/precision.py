"""The CUDA adapter's precision: fp8 through TransformerEngine or torchao, as a `Precision` subclass."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from accel.precision.base import Precision, enter_all, wrap_forward_in_autocast

from . import fp8


class CUDAPrecision(Precision):
    """fp8: Linears swapped by the backend the handlers name (`CUDAAdapter.convert_to_fp8`), the
    forward under bf16 autocast for the layers that stay in high precision, and under
    TransformerEngine's `fp8_autocast` with its recipe (in eval mode only when
    `TERecipeKwargs.use_autocast_during_eval`). Other modes are the core's."""

    def convert_module(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        if self.mode != "fp8":
            return super().convert_module(model, ctx)
        adapter = self.adapter
        model = adapter.convert_to_fp8(model, ctx)
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
