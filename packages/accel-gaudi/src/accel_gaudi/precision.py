"""The Gaudi adapter's precision: bf16 autocast by Gaudi's `force_autocast` rule and fp8 through
Habana's transformer engine (emulated by `accel_gaudi.hpu_emulated`), as a `Precision` subclass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from accel.precision.base import Precision, enter_all, in_training_or, wrap_forward_in_autocast
from accel.precision.fp8_request import NO_FP8_REQUEST

from .fp8 import GaudiFP8RecipeKwargs, convert_linears, recipe_from_request, wrap_gradient_checkpointing

if TYPE_CHECKING:
    from accel.prepare.context import PrepareContext


class GaudiPrecision(Precision):
    """How a model runs in the Gaudi adapter's precision (`GaudiAdapter.precision_class`).

    - Module conversion: under fp8 (`mixed_precision="fp8"`, or the `fp8` option with any mode)
      every `nn.Linear` becomes Habana's fp8 Linear holding the same Parameters, with the recipe
      of a `GaudiFP8RecipeKwargs` handler, else of Accelerate's recipe handlers and the launcher's fp8
      settings (`RunContext.fp8`) over Gaudi's defaults, and gradient-checkpointed blocks recompute in
      fp8 as their forward ran.
    - Forward context: bf16 autocast when `autocasts` says so (Gaudi's `force_autocast` rule) or with
      `use_torch_autocast` (any precision, not under DeepSpeed),
      then the vendor's `fp8_autocast` with the model's recipe under fp8; outputs come back in fp32.

    The scaler, unscaling and the optimizer step are the core's (Gaudi refuses fp16, so no loss scaling).
    """

    @property
    def autocasts(self) -> bool:
        """Whether a prepared model's forward runs under bf16 autocast (`GaudiOptions.autocast_policy`):
        "native_amp" (Gaudi's rule) only for bf16 with `force_autocast`; "always" for bf16, and with
        `force_autocast` whatever the mode."""
        config = self.adapter.config
        if config.autocast_policy == "always":
            return self.mode == "bf16" or bool(config.force_autocast)
        return self.mode == "bf16" and bool(config.force_autocast)

    @property
    def fp8(self) -> bool:
        """Whether models are converted to fp8: `mixed_precision="fp8"` or the adapter's `fp8` option."""
        return self.mode == "fp8" or bool(self.adapter.config.fp8)

    def convert_module(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        """fp8 layers (`convert_fp8`) when `fp8`, and the forward under the contexts `autocasts` and
        `fp8` ask for (fresh ones per call, bf16 autocast outermost); no wrapper when there are none."""
        adapter = self.adapter
        contexts: list[Any] = []
        # optimum-habana's `use_torch_autocast` autocasts under any precision, but not under DeepSpeed.
        torch_autocast = bool(adapter.config.use_torch_autocast) and ctx.strategy.name != "deepspeed"
        if self.autocasts or torch_autocast:
            kwargs = ctx.autocast_kwargs
            contexts.append(lambda: adapter.autocast("bf16", **kwargs))
        if self.fp8:
            model = self.convert_fp8(model, ctx)
            recipe = model._accel_fp8_recipe
            contexts.append(in_training_or(model, model._accel_fp8_eval, lambda: adapter.vendor.fp8_autocast(recipe)))
        if contexts:
            wrap_forward_in_autocast(model, lambda: enter_all(contexts))
        return model

    def recipe(self, ctx: PrepareContext) -> tuple[GaudiFP8RecipeKwargs, bool | None]:
        """The recipe and whether eval runs in fp8 too (None: yes, Gaudi's way): a `GaudiFP8RecipeKwargs`
        handler, else Accelerate's recipe handlers and the launcher's fp8 settings (`RunContext.fp8`).

        Raises:
            ValueError: a `GaudiFP8RecipeKwargs` and an Accelerate-named recipe handler together.
        """
        own = ctx.handler(GaudiFP8RecipeKwargs)
        request = getattr(ctx, "fp8", None) or NO_FP8_REQUEST
        if own is None:
            return recipe_from_request(request)
        if request.backend is not None and request.backend_source != "ACCEL_FP8_BACKEND":
            raise ValueError(f"GaudiFP8RecipeKwargs and {request.backend_source} both set the fp8 recipe: pass one.")
        return own, None

    def convert_fp8(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        """Swap every `nn.Linear` for Habana's fp8 Linear (same Parameters, Gaudi's `convert_model`
        path), keep the recipe on the model as `_accel_fp8_recipe`, and make gradient-checkpointed
        blocks recompute under it. Converting twice is a no-op.

        Raises:
            ValueError: on a first-generation Gaudi (`GaudiAdapter.check_fp8_supported`).
            accel.errors.FP8RecipeError: a recipe setting Habana's transformer engine cannot honour, named.
        """
        adapter = self.adapter
        if getattr(model, "_accel_fp8_recipe", None) is None:
            adapter.check_fp8_supported()
            handler, eval_too = self.recipe(ctx)
            with torch.no_grad():
                convert_linears(model, adapter.vendor)
            model._accel_fp8_recipe = handler.recipe(adapter.vendor)
            model._accel_fp8_eval = True if eval_too is None else eval_too  # type: ignore[assignment]
        wrap_gradient_checkpointing(model, adapter.vendor, model._accel_fp8_recipe)
        return model
