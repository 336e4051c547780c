"""The CUDA adapter's precision: fp8 through TransformerEngine or torchao, as a `Precision` subclass."""

from __future__ import annotations

from typing import Any

import torch
from accel.precision.base import Precision, enter_all, in_training_or, wrap_forward_in_autocast
from accel.precision.fp8_request import NO_FP8_REQUEST

from . import fp8


class CUDAPrecision(Precision):
    """fp8: Linears swapped by the backend the recipe names (`convert_fp8`), the forward under bf16 autocast
    for the layers that stay in high precision, and under TransformerEngine's `fp8_autocast` with its recipe
    (in eval mode only when `use_autocast_during_eval`). The recipe comes from this adapter's
    `accel_cuda.TERecipeKwargs` / `AORecipeKwargs`, else from Accelerate's handlers and the launcher's fp8
    settings (`RunContext.fp8`), every field applied or refused by name. Other modes are the core's."""

    def convert_module(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        if self.mode != "fp8":
            return super().convert_module(model, ctx)
        adapter = self.adapter
        model = self.convert_fp8(model, ctx)
        kwargs = ctx.autocast_kwargs
        contexts: list[Any] = [lambda: adapter.autocast("bf16", **kwargs)]
        recipe = getattr(model, "_accel_te_recipe", None)
        if recipe is not None:
            contexts.append(
                in_training_or(model, model._accel_fp8_eval, lambda: adapter.vendor.te_fp8_autocast(recipe))
            )
        wrap_forward_in_autocast(model, lambda: enter_all(contexts))
        return model

    def convert_fp8(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        """Swap Linears for fp8 ones with the backend the recipe names, else whichever is installed.
        TransformerEngine: the recipe on the model as `_accel_te_recipe`; torchao: the `Float8LinearConfig` as
        `_accel_ao_config`, and under FSDP2 with fp8 all-gather the weights' scales precomputed after each
        step of the model's optimizers (as Accelerate does). Converting twice is a no-op.

        Raises:
            accel_cuda.fp8.FP8BackendError: neither TransformerEngine nor torchao is installed
                (the message names both), or the named one is not.
            accel.errors.FP8RecipeError: a recipe setting this backend or GPU cannot honour, named.
        """
        if getattr(model, "_accel_fp8_backend", None) is not None:
            return model
        vendor = self.adapter.vendor
        request = getattr(ctx, "fp8", None) or NO_FP8_REQUEST
        own_te, own_ao = ctx.handler(fp8.TERecipeKwargs), ctx.handler(fp8.AORecipeKwargs)
        wanted, te_kwargs, ao_kwargs = fp8.from_request(request, own_te, own_ao)
        source = f"accel_cuda.{type(own_te or own_ao).__name__}" if own_te or own_ao else request.backend_source
        backend = fp8.choose_backend(vendor, wanted, source)
        with torch.no_grad():
            if backend == "te":
                te_kwargs = te_kwargs or fp8.TERecipeKwargs()
                fp8.check_mxfp8(vendor, te_kwargs, request)
                fp8.convert_te(model, vendor)
                model._accel_te_recipe = te_kwargs.recipe(vendor)
                model._accel_fp8_eval = te_kwargs.use_autocast_during_eval  # type: ignore[assignment]
            else:
                ao_kwargs = ao_kwargs or fp8.AORecipeKwargs()
                keep = ao_kwargs.module_filter_func or fp8.default_ao_filter(model)
                config = ao_kwargs.float8_config(vendor)
                vendor.ao_convert(model, config, keep)
                model._accel_ao_config = config
                if ctx.strategy.name == "fsdp2" and getattr(config, "enable_fsdp_float8_all_gather", False):
                    for optimizer in ctx.optimizers:
                        optimizer.register_step_post_hook(lambda *_: vendor.ao_precompute_fsdp_scales(model))
        model._accel_fp8_backend = backend  # type: ignore[assignment]
        return model
