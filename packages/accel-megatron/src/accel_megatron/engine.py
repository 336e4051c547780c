"""Accelerate's `MegatronEngine`: the prepared model whose call runs a whole training step.

`accelerator.prepare(model)` returns a `MegatronEngine` for a Hugging Face GPT-2/Llama, and for any model when the
plugin gives Accelerate's train-step hooks (`custom_train_step_class`, `custom_get_batch_function`,
`custom_loss_function`). In training mode `model(**batch)` zeroes the gradients, runs forward and backward of the
batch's `num_micro_batches` micro-batches through megatron-core's schedule, steps the prepared optimizer and
scheduler, and returns the loss; the loop's `accelerator.backward(loss)`, `optimizer.step()`, `scheduler.step()` and
`optimizer.zero_grad()` after it do nothing, as in Accelerate. In evaluation mode it is Accelerate's `eval_step`.

The step itself is, in this order of precedence:
- `custom_train_step_class(args, **custom_train_step_kwargs)`: an object with Megatron-LM's
  `forward_step(data_iterator, model) -> (output_tensor, loss_func)` (and optionally `model_output_class`), as
  Accelerate's `AbstractTrainStep` subclasses have; `args` is an `argparse.Namespace` of the plugin's fields, the
  Megatron-LM names of its sizes and, for a Hugging Face model, Accelerate's parsed model arguments;
- `custom_get_batch_function(data_iterator) -> (tokens, labels, loss_mask, attention_mask, position_ids)` and/or
  `custom_loss_function(loss_mask, output_tensor) -> (loss, {"lm loss": ...})` in Accelerate's GPT step:
  `model(tokens, position_ids, attention_mask, labels=labels)` gives the per-token losses;
- otherwise, for a Hugging Face model, `GPTTrainStep` (the Hugging Face model's loss).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import hf
from .parallel import ModelChunks
from .plugin import MegatronConfigError, MegatronPlugin

HF_KEYS = frozenset({"input_ids", "labels", "attention_mask"})
"""The batch keys `GPTTrainStep` reads."""


class AbstractTrainStep:
    """Accelerate's base class for `MegatronPlugin(custom_train_step_class=...)`.

    A subclass is built as `cls(args, **custom_train_step_kwargs)` and sets `self.forward_step` (Megatron-LM's
    `forward_step(data_iterator, model) -> (output_tensor, loss_func)`, with `loss_func(output_tensor) ->
    (loss, {name: value})`) and optionally `self.model_output_class` (e.g. transformers'
    `CausalLMOutputWithCrossAttentions`: `model(**batch)` then returns `model_output_class(loss=..., logits=...)`).
    The `get_*_func` methods are Accelerate's conventional places to build them.
    """

    model_output_class: Any = None

    def __init__(self, name: str) -> None:
        self.name = name

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> Any:
        """The function that takes a micro-batch off the data iterator (override)."""

    def get_forward_step_func(self) -> Any:
        """Megatron-LM's forward step (override)."""

    def get_loss_func(self, accelerator: Any) -> Any:
        """The loss function the forward step hands to the schedule (override)."""


def megatron_args(plugin: MegatronPlugin, config: Any = None) -> argparse.Namespace:
    """What a `custom_train_step_class` is built with: the plugin's fields, the Megatron-LM names of the parallel
    sizes, and for a Hugging Face model Accelerate's parsed model arguments (`hf.megatron_args`)."""
    from megatron.core import parallel_state

    args = {f.name: getattr(plugin, f.name) for f in dataclasses.fields(plugin)}
    args |= {
        "tensor_model_parallel_size": plugin.tp_degree,
        "pipeline_model_parallel_size": plugin.pp_degree,
        "context_parallel_size": plugin.cp_degree,
        "data_parallel_size": parallel_state.get_data_parallel_world_size(),
        "model_return_dict": True,
    }
    if config is not None:
        args |= hf.megatron_args(config, plugin)
    return argparse.Namespace(**args)


def uses_engine(plugin: MegatronPlugin, hf_config: Any) -> bool:
    """Whether the prepared model is a `MegatronEngine`: a Hugging Face model, or Accelerate's train-step hooks."""
    hooks = (plugin.custom_train_step_class, plugin.custom_get_batch_function, plugin.custom_loss_function)
    return hf_config is not None or any(hook is not None for hook in hooks)


def _transformers_batch(data_iterator: Any) -> tuple[Any, ...]:
    """Accelerate's GPT batch function for a batch without `custom_get_batch_function`: megatron-core's GPT dataset
    items (`tokens`, `labels`, `loss_mask`, `position_ids`), or Hugging Face batches (`input_ids`, optional
    `labels` with -100 left out of the loss mask), the labels shifted to the next token; causal attention."""
    micro = next(data_iterator)
    if "tokens" in micro:
        return micro["tokens"], micro["labels"], micro["loss_mask"], micro.get("attention_mask"), micro["position_ids"]
    if "input_ids" not in micro:
        raise MegatronConfigError(
            f"The batch has keys {sorted(micro)}: give MegatronPlugin(custom_get_batch_function=...) to take it "
            "apart, or batches with input_ids (and labels)."
        )
    tokens = micro["input_ids"]
    labels = micro.get("labels", tokens)
    shifted = torch.full_like(labels, -100)
    shifted[:, :-1] = labels[:, 1:]
    loss_mask = (shifted != -100).float()
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
    return tokens, shifted.clamp(min=0), loss_mask, None, positions


def _masked_mean_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Accelerate's GPT loss: the per-token losses averaged over the loss mask; "lm loss" averaged over DP."""
    from .utils import avg_losses_across_data_parallel_group

    mask = loss_mask.reshape(-1).float()
    loss = (output_tensor.float().reshape(-1) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"lm loss": avg_losses_across_data_parallel_group([loss])[0]}


def _gpt_forward_step(plugin: MegatronPlugin) -> Callable[[Any, nn.Module], tuple[Any, Callable[..., Any]]]:
    """Accelerate's `GPTTrainStep.forward_step` with the plugin's batch and loss functions (or the defaults)."""
    get_batch = plugin.custom_get_batch_function or _transformers_batch
    loss_func = plugin.custom_loss_function or _masked_mean_loss

    def forward_step(data_iterator: Any, model: nn.Module) -> tuple[Any, Callable[..., Any]]:
        tokens, labels, loss_mask, attention_mask, position_ids = get_batch(data_iterator)
        output = model(tokens, position_ids, attention_mask, labels=labels)
        return output, functools.partial(loss_func, loss_mask)

    return forward_step


class MegatronEngine(ModelChunks):
    """A model prepared under the megatron strategy that is called as Accelerate's `MegatronEngine`.

    - Training mode, `model(**batch)`: one whole training step (see the module's docstring). It returns what
      Accelerate's engine returns: `model_output_class(loss=..., logits=...)` (transformers'
      `CausalLMOutputWithCrossAttentions` for the Hugging Face step), else the loss tensor. The loss is on every
      pipeline stage. The user's `accelerator.backward(loss)`, `optimizer.step()`, `scheduler.step()` and
      `optimizer.zero_grad()` after it do nothing.
    - Evaluation mode (`model.eval()`): Accelerate's `eval_step`: the loss, and logits (the plugin's
      `return_logits` with `GPTTrainStep`; a "logits" entry of a custom loss function's dict). Under the plugin's
      `tensorboard_dir` the evaluation losses are averaged until `model.train()`, which logs them as Accelerate's
      engine does (`strategy.log_eval_results`: "{name} validation" and its ppl, and the printed line).
    - Positional arguments: megatron-core's model forward of the single chunk (for `strategy.train_step` /
      `GPTTrainStep` loops).
    """

    def __init__(self, chunks: list[nn.Module], strategy: Any, hf_config: Any = None) -> None:
        super().__init__(chunks)
        self.strategy = strategy  # not a module: nn.Module keeps it as a plain attribute
        self.hf_config = hf_config
        self._handler: Any = None
        self._eval_totals: dict[str, list[float]] = {}
        """Under `tensorboard_dir`: each evaluation loss's sum and count since the last `train()`."""

    def train(self, mode: bool = True) -> MegatronEngine:
        """`nn.Module.train`; back in training mode after evaluation, the evaluation losses are logged (Accelerate's
        `MegatronEngine.train` calls its `log_eval_results`)."""
        super().train(mode)
        if mode and self._eval_totals:
            results = {name: total / count for name, (total, count) in self._eval_totals.items()}
            self._eval_totals = {}
            self.strategy.log_eval_results(results)
        return self

    def _keep_eval(self, losses: dict[str, Any]) -> None:
        if self.strategy.plugin.tensorboard_dir is None:
            return
        for name, value in losses.items():
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                total, count = self._eval_totals.get(name, [0.0, 0])
                self._eval_totals[name] = [total + float(value), count + 1]

    def forward(self, *args: Any, **batch: Any) -> Any:
        if args:
            if len(self.chunks) > 1:
                return super().forward(*args, **batch)
            return self.chunks[0](*args, **batch)
        handler = self._step_handler()
        if handler is None:
            return self._hf_step(batch)
        forward_step = getattr(handler, "forward_step", None)
        if not callable(forward_step):
            raise MegatronConfigError(
                f"{type(handler).__name__} (MegatronPlugin.custom_train_step_class) has no forward_step: set "
                "self.forward_step = forward_step(data_iterator, model) -> (output_tensor, loss_func) in its __init__."
            )
        if self.training:
            loss, reduced = self._train(
                lambda: self.strategy.run_forward_step(self, batch, forward_step, forward_only=False)
            )
        else:
            with torch.no_grad():
                loss, reduced = self.strategy.run_forward_step(self, batch, forward_step, forward_only=True)
            self._keep_eval(reduced)
        output_class = getattr(handler, "model_output_class", None)
        if output_class is not None:
            return output_class(loss=loss, logits=reduced.get("logits"))
        return loss

    def _step_handler(self) -> Any:
        """The custom train step (built once), Accelerate's GPT step with the plugin's functions, or None for
        `GPTTrainStep`."""
        plugin: MegatronPlugin = self.strategy.plugin
        if self._handler is None:
            if plugin.custom_train_step_class is not None:
                args = megatron_args(plugin, self.hf_config)
                self._handler = plugin.custom_train_step_class(args, **(plugin.custom_train_step_kwargs or {}))
            elif plugin.custom_get_batch_function is not None or plugin.custom_loss_function is not None:
                self._handler = AbstractTrainStep("GPTTrainStep")
                self._handler.forward_step = _gpt_forward_step(plugin)
        return self._handler

    def _hf_step(self, batch: dict[str, Any]) -> Any:
        unknown = sorted(set(batch) - HF_KEYS)
        if unknown or "input_ids" not in batch:
            raise MegatronConfigError(
                f"model(**batch) under Megatron reads input_ids, labels and attention_mask; got {sorted(batch)}. "
                f"Leave out {unknown or 'nothing'} (megatron-core builds positions and the causal mask) "
                "and give input_ids, or take the batch apart yourself with MegatronPlugin(custom_get_batch_function=...)."
            )
        from transformers.modeling_outputs import CausalLMOutputWithCrossAttentions

        step = hf.GPTTrainStep(self.strategy)
        if not self.training:
            result = step.eval_step(self, batch)
            self._keep_eval({"lm loss": result["lm loss"]})
            return CausalLMOutputWithCrossAttentions(loss=result["lm loss"], logits=result.get("logits"))
        loss, _ = self._train(lambda: (step(self, batch), {}))
        return CausalLMOutputWithCrossAttentions(loss=loss)

    def _train(
        self, forward_backward: Callable[[], tuple[torch.Tensor, dict[str, Any]]]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Zero the gradients, run `forward_backward`, step the prepared optimizers and schedulers (through the
        Accelerator's wrappers, so gradient state, adapter hooks and logging act as in the user's loop)."""
        from accel.distributed.state import GradientState

        accumulation = GradientState().num_steps
        if accumulation > 1:
            raise MegatronConfigError(
                f"gradient_accumulation_steps={accumulation}: under Megatron model(**batch) runs a whole step over "
                "the batch's micro-batches; set MegatronPlugin(num_micro_batches=...) and gradient_accumulation_steps=1."
            )
        optimizers, schedulers = self.strategy.prepared_steppers()
        if not optimizers:
            raise MegatronConfigError(
                "model(**batch) runs the whole training step under Megatron (forward, backward, optimizer and "
                "scheduler step, as Accelerate's Megatron-LM engine): prepare the optimizer before calling the model."
            )
        with self.strategy.driver.driving():
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss, reduced = forward_backward()
            for optimizer in optimizers:
                optimizer.step()
            for scheduler in schedulers:
                scheduler.step()
        return loss.detach(), reduced
