"""`MegatronStrategy`: megatron-core tensor, pipeline and data parallelism behind `Accelerator.prepare`.

Registered in the `accel.strategies` entry-point group as "megatron", so
`Accelerator(megatron_lm_plugin=MegatronPlugin(...))` (or `strategy="megatron"`) selects it.
The hardware adapter still places models and owns the device; this strategy only adds
megatron-core's parallel state, its DDP, its optimizer and its schedules.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.strategies.base import Strategy
from torch import nn

from . import checkpoint, engine, hf, parallel, schedule
from .data import DatasetsBuilder, MegatronLMDummyDataLoader
from .optim import (
    MegatronLMDummyScheduler,
    MegatronOptimizer,
    MegatronScheduler,
    StepDriver,
    build_optimizer,
    build_scheduler,
)
from .plugin import MegatronConfigError, MegatronPlugin

# Accelerate's own messages (its Megatron-LM branch of `prepare`), so code that matches on them keeps working.
DEVICE_PLACEMENT = "You can't customize device placements with DeepSpeed or Megatron-LM."
MULTIPLE_MODELS = "You can't use same `Accelerator()` instance with multiple models when using Megatron-LM"

if TYPE_CHECKING:
    from accel.distributed.distributed_type import DistributedType
    from accel.prepare.context import RunContext
    from accel.prepare.group import PrepareGroup
    from accel.prepare.prepared import Prepared


class MegatronStrategy(Strategy):
    """Megatron-core parallelism, configured by a `MegatronPlugin`."""

    name: ClassVar[str] = "megatron"
    config_class: ClassVar[type] = MegatronPlugin
    """What `ACCEL_STRATEGY_CONFIG` and Accelerate's `MEGATRON_LM_*` settings build (found through the registry)."""
    rebuilds_schedulers: ClassVar[bool] = True  # megatron-core's OptimizerParamScheduler, built in setup

    def __init__(self, config: Any = None) -> None:
        if config is None:
            config = MegatronPlugin()
        if not isinstance(config, MegatronPlugin):
            raise TypeError(
                f"The megatron strategy is configured with accel_megatron.MegatronPlugin, got {type(config).__name__}."
            )
        super().__init__(config)
        self.plugin: MegatronPlugin = config
        self.device: torch.device | None = None
        self.models: list[nn.Module] = []
        """Every DDP-wrapped model chunk (one per prepared model, or one per virtual pipeline stage)."""
        self._prepared_models = 0
        # The megatron-core optimizer built for each user optimizer (by id), for schedulers prepared later.
        self._built: dict[int, Any] = {}
        self._datasets = DatasetsBuilder(config)
        self.global_batch_size: int | None = None
        """Samples per optimizer step over all replicas, from the first loader prepared (the train loader)."""
        self.driver = StepDriver()
        """Whether `model(**batch)` runs the training step (a prepared Hugging Face model, as in Accelerate)."""
        self._prepared: Prepared | None = None

    def distributed_type(self, use_distributed: bool) -> DistributedType:
        from accel.distributed.distributed_type import DistributedType

        return DistributedType.MEGATRON_LM

    # ---- setup ---------------------------------------------------------------------------
    def _ensure_initialized(self, device: torch.device, backend: str) -> None:
        if self.device is None:
            parallel.initialize(self.plugin, device, backend)
            self.device = device

    def redirect(self) -> contextlib.AbstractContextManager[Any]:
        """Where megatron-core's CUDA-only lookups go on this device (nothing to do on CUDA)."""
        assert self.device is not None
        return parallel.on_device(self.device)

    def validate_device_placement(self, device_placement: list[bool]) -> None:
        """A per-object `device_placement` list is refused, as Accelerate does under Megatron-LM (ValueError)."""
        raise ValueError(DEVICE_PLACEMENT)

    def validate_prepare(self, objects: tuple[Any, ...], ctx: RunContext) -> None:
        """One model per Accelerator, as in Accelerate (AssertionError with its message); then parallel state."""
        models = [o for o in objects if isinstance(o, nn.Module) and not self.is_wrapped(o)]
        if len(models) + self._prepared_models > 1:
            raise AssertionError(MULTIPLE_MODELS)
        # Parallel state first, whatever the argument order: data loaders need the DP group.
        self._ensure_initialized(ctx.device, ctx.adapter.backend)
        from megatron.core import parallel_state
        from torch.utils.data import DataLoader

        dp = parallel_state.get_data_parallel_world_size()
        for obj in objects:
            plain = isinstance(obj, DataLoader) and not isinstance(obj, MegatronLMDummyDataLoader)
            if plain and self.global_batch_size is None and obj.batch_size:
                # The first loader prepared is the train loader (Megatron-LM's global batch size).
                self.global_batch_size = obj.batch_size if ctx.split_batches else obj.batch_size * dp
            if isinstance(obj, MegatronLMDummyDataLoader) and not getattr(obj, "_is_accel_prepared", False):
                # Megatron's split for it, before the core shards it over the data-parallel group.
                self._datasets.fill(obj, dp, self.plugin.seed)
                if self.global_batch_size is None:
                    self.global_batch_size = obj.batch_size * dp  # type: ignore[operator]
            elif isinstance(obj, DataLoader) and self.plugin.megatron_dataset_flag:
                raise MegatronConfigError(
                    "megatron_dataset_flag=True: the data comes from Megatron's datasets; prepare "
                    "accel_megatron.MegatronLMDummyDataLoader(...) instead of a DataLoader, or unset the flag."
                )

    def data_parallel_group(self) -> Any:
        if self.device is None:
            return None
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_group()

    def wrap_model(self, model: nn.Module, ctx: RunContext) -> nn.Module:
        self._ensure_initialized(ctx.device, ctx.backend)
        provider = self.plugin.custom_model_provider_function
        if provider is not None and not isinstance(model, parallel.ModelProvider) and not _is_megatron_module(model):
            model = parallel.ModelProvider(provider)  # Accelerate: it builds the model in place of the one given
        hf_weights, hf_config = None, None
        if provider is None and hf.is_hf_model(model):
            hf_config = model.config
            # Accelerate's model parsers: the Hugging Face config gives the megatron-core network; its weights
            # are converted into megatron-core's layout and loaded into this process's shards.
            hf_weights = hf.to_megatron(model.state_dict(), model.config)
            model = parallel.ModelProvider(hf.provider(model.config, self.plugin))
        if isinstance(model, parallel.ModelProvider):
            with parallel.on_device(ctx.device):  # tied embeddings under PP: megatron-core moves them with .cuda()
                stages = model.build()
            if ctx.device_placement:
                stages = [stage.to(ctx.device) for stage in stages]
            if hf_weights is not None:
                for stage in stages:
                    checkpoint.load_full_state_dict(stage, hf_weights)
        else:
            stages = [model]
        wrapped = []
        for i, stage in enumerate(stages):
            parallel.check_config(parallel.model_config(stage), self.plugin, stage)
            if not ctx.evaluation_mode:
                stage = parallel.half_precision(stage, ctx.mixed_precision)
            wrapped.append(parallel.wrap_ddp(stage, self.plugin, ctx.device, first_chunk=i == 0))
        self.models.extend(wrapped)
        self._prepared_models += 1
        if engine.uses_engine(self.plugin, hf_config):  # model(**batch) runs Accelerate's Megatron-LM engine step
            return engine.MegatronEngine(wrapped, self, hf_config)
        # One chunk: the DDP-wrapped model itself; the interleaved schedule's chunks: one container.
        return wrapped[0] if len(wrapped) == 1 else parallel.ModelChunks(wrapped)

    def unwrap(self, model: nn.Module) -> nn.Module:
        from megatron.core.distributed import DistributedDataParallel
        from megatron.core.transformer.module import Float16Module

        if isinstance(model, engine.MegatronEngine) and len(model.chunks) == 1:
            model = model.chunks[0]
        if isinstance(model, DistributedDataParallel):
            model = model.module
        return model.module if isinstance(model, Float16Module) else model

    def is_wrapped(self, model: nn.Module) -> bool:
        from megatron.core.distributed import DistributedDataParallel

        return isinstance(model, (DistributedDataParallel, parallel.ModelChunks))

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        if not self.is_wrapped(model):
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for chunk in parallel.chunks_of(model):  # every chunk of an interleaved or Hugging Face model
            stack.enter_context(chunk.no_sync())  # type: ignore[operator]
        return stack

    def setup(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """megatron-core's optimizer over the DDP-wrapped model's gradient buffers, and the user's torch
        schedulers rebuilt as its `OptimizerParamScheduler` (same schedule) over that optimizer.

        A group holds a model with its optimizers and schedulers, or optimizers or schedulers prepared
        in a later call than their model (or optimizer): those find it among what is prepared already.
        """
        self._prepared = prepared
        optimizers = [self._optimizer(opt, ctx) for opt in group.optimizers]
        owners = {id(old): new for old, new in zip(group.optimizers, optimizers)}
        schedulers = [self._scheduler(sched, owners, prepared) for sched in group.schedulers]
        return group.replace(optimizers=optimizers, schedulers=schedulers)

    def _optimizer(self, optimizer: Any, ctx: RunContext) -> Any:
        if isinstance(optimizer, MegatronOptimizer):
            return optimizer
        if not self.models:
            raise MegatronConfigError(
                "Prepare the megatron-core model before (or together with) its optimizer: megatron-core's "
                "optimizer is built over the DDP-wrapped model's gradient buffers."
            )
        built = build_optimizer(optimizer, self.models, self.plugin, self.redirect, ctx.mixed_precision)
        built.driver = self.driver
        self._built[id(optimizer)] = built
        if built._logger is not None:  # Megatron-LM's batch size: the samples of one optimizer step
            steps = ctx.gradient_accumulation_steps
            built._logger.batch_size = lambda: (
                None if self.global_batch_size is None else self.global_batch_size * steps
            )
        return built

    def _scheduler(self, scheduler: Any, owners: dict[int, Any], prepared: Prepared) -> Any:
        if isinstance(scheduler, MegatronScheduler):
            return scheduler
        base = getattr(scheduler, "optimizer", None)
        owner = owners.get(id(base)) or self._built.get(id(base))
        if owner is None:
            owner = next(
                (o.optimizer for o in prepared.optimizers if isinstance(o.optimizer, MegatronOptimizer)),
                None,
            )
        if owner is None:
            raise MegatronConfigError("Prepare the optimizer before (or together with) its scheduler.")
        increment = 1
        if isinstance(scheduler, MegatronLMDummyScheduler) and self.plugin.train_samples is not None:
            if self.global_batch_size is None:
                raise MegatronConfigError(
                    "A schedule in samples (train_samples) steps by the global batch size: prepare the train "
                    "DataLoader before (or together with) the MegatronLMDummyScheduler."
                )
            increment = self.global_batch_size
        return MegatronScheduler(build_scheduler(scheduler, owner, self.plugin), owner, increment)

    def backward(self, loss: torch.Tensor, *, sync: bool, **kwargs: Any) -> bool:
        """fp16: the loss times megatron-core's (dynamic) loss scale, which its optimizer unscales.

        After `model(**batch)` ran the step (a Hugging Face model, Accelerate's Megatron-LM engine) the loss it
        returned needs no backward: nothing happens, as in Accelerate. A loss with a graph is refused then: its
        gradients would reach no optimizer step.
        """
        if self.driver.skips():
            if loss.requires_grad:
                raise MegatronConfigError(
                    "model(**batch) already ran the backward pass and the optimizer step of this batch (Accelerate's "
                    "Megatron-LM engine), so the gradients of another loss would be dropped; pass the loss it "
                    "returned (outputs.loss) or train through accel_megatron.GPTTrainStep instead."
                )
            return True
        configs: list[Any] = [getattr(m, "config", None) for m in self.models]
        scaler: Any = next((c.grad_scale_func for c in configs if getattr(c, "fp16", False)), None)
        # Off CUDA, MoE layers' backward collectives ask for the CUDA device too.
        self._record_loss(loss, scheduled=False)
        moe = any(getattr(getattr(m, "module", m), "_accel_moe", False) for m in self.models)
        with self.redirect() if moe else contextlib.nullcontext():
            if scaler is None:
                return super().backward(loss, sync=sync, **kwargs)
            scaler(loss).backward(**kwargs)
        return True

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        """Through megatron-core's optimizer: the global L2 norm over every shard of the prepared model
        (its optimizer's parameters, whatever `parameters` lists), clipped as its `clip_grad` clips."""
        if self.driver.model_driven:
            raise MegatronConfigError(
                "model(**batch) runs the optimizer step itself (Accelerate's Megatron-LM engine), so clipping after it "
                "has no step to act on; set MegatronPlugin(gradient_clipping=...), which it applies inside the step."
            )
        if float(norm_type) != 2.0:
            raise MegatronConfigError(
                f"megatron-core clips the L2 norm only; clip_grad_norm_(norm_type={norm_type}) is not supported."
            )
        optimizers = list(self._built.values())
        if len(optimizers) != 1:
            raise MegatronConfigError("clip_grad_norm_ under megatron-core needs exactly one prepared optimizer.")
        return optimizers[0].clip_grad_norm_(float(max_norm))

    # ---- pipeline steps --------------------------------------------------------------------
    def train_step(
        self,
        model: nn.Module,
        batch: Any,
        forward_fn: Callable[[nn.Module, Any], torch.Tensor],
        loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
        *,
        forward_only: bool = False,
        seq_length: int | None = None,
    ) -> Any:
        """Forward and backward of one batch through megatron-core's pipeline schedule.

        The batch is split into `num_micro_batches` along dim 0; `forward_fn(model, micro_batch)`
        runs this process's stage, `loss_fn(output, micro_batch)` the last stage's loss. Returns
        the mean loss over micro-batches on every process of the pipeline. Gradients are left in
        DDP's buffers for `optimizer.step()`. `seq_length`: the sequence length of the
        activations between stages when it is not dim 1 of the batch (e.g. tokens that hold
        the shifted labels too). `forward_only`: evaluation, no backward; with the plugin's
        `return_logits` it returns `(loss, outputs)`, the last stage's outputs of the batch
        concatenated along dim 0 (None on other pipeline stages), as Accelerate's `eval_step`.
        """
        self._check_training_step(forward_only)
        outputs: list[torch.Tensor] | None = [] if forward_only and self.plugin.return_logits else None
        with self.redirect():
            loss = schedule.run(
                parallel.chunks_of(model),
                batch,
                forward_fn,
                loss_fn,
                self.plugin.num_micro_batches,
                forward_only=forward_only,
                seq_length=seq_length or self.plugin.seq_length,
                outputs=outputs,
            )
        if not forward_only:
            self._record_loss(loss, scheduled=True)
        if outputs is None:
            return loss
        return loss, (torch.cat(outputs) if outputs else None)

    def run_forward_step(
        self, model: nn.Module, batch: Any, forward_step: Callable[..., Any], *, forward_only: bool = False
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One batch through megatron-core's schedule with Megatron-LM's `forward_step(data_iterator, model)`
        (Accelerate's train-step protocol); returns the step's loss on every pipeline stage and the last stage's
        loss dict averaged over micro-batches (`schedule.run_forward_step`). Gradients stay in DDP's buffers."""
        self._check_training_step(forward_only)
        with self.redirect():
            loss, reduced = schedule.run_forward_step(
                parallel.chunks_of(model),
                batch,
                forward_step,
                self.plugin.num_micro_batches,
                forward_only=forward_only,
                seq_length=self.plugin.seq_length,
            )
        if not forward_only:
            self._record_loss(loss, scheduled=True)
        return loss, reduced

    def _check_training_step(self, forward_only: bool) -> None:
        """A training step through `train_step`/`run_forward_step` after `model(**batch)` began stepping the
        optimizer itself is refused: the loop's own `optimizer.step()` would do nothing."""
        assert self.device is not None, "prepare a model first"
        if not forward_only and self.driver.skips():
            raise MegatronConfigError(
                "This run's steps go through model(**batch) (Accelerate's Megatron-LM engine), which steps the "
                "optimizer itself; train either by calling the model or through train_step/GPTTrainStep, not both."
            )

    def log_eval_results(self, results: dict[str, float]) -> None:
        """Accelerate's `log_eval_results`: each evaluation metric (e.g. the mean loss of the `forward_only`
        steps, averaged over the data-parallel replicas) to TensorBoard as "{name} validation" and
        "{name} validation ppl" (exp, capped at e^20) at the current optimizer step, each also "... vs samples"
        (consumed samples), and printed by the last process, as Megatron-LM does. Nothing without `tensorboard_dir` or before the first step."""
        import torch.distributed as dist

        from .tensorboard import perplexity

        optimizer = next(iter(self._built.values()), None)
        if self.plugin.tensorboard_dir is None or optimizer is None or optimizer.iteration == 0:
            return
        line = f"validation loss at iteration {optimizer.iteration} | " + " | ".join(
            f"{name} value: {float(value)} | {name} PPL: {perplexity(float(value))}" for name, value in results.items()
        )
        if optimizer._logger is not None:
            optimizer._logger.log_eval(results, optimizer.iteration)
        if not dist.is_initialized() or dist.get_rank() == dist.get_world_size() - 1:
            print("-" * (len(line) + 1) + "\n" + line + "\n" + "-" * (len(line) + 1))

    def _record_loss(self, loss: torch.Tensor, *, scheduled: bool) -> None:
        """For TensorBoard's "lm loss" (only under `tensorboard_dir`)."""
        for optimizer in self._built.values():
            if optimizer.log_losses:
                kept = optimizer.schedule_losses if scheduled else optimizer.losses
                kept.append(loss.detach().reshape(()).float().cpu())

    def prepared_steppers(self) -> tuple[list[Any], list[Any]]:
        """The prepared optimizers and schedulers that step megatron-core's optimizer (the Accelerator's
        wrappers, so gradient state, adapter hooks and logging act as in the user's loop)."""
        if self._prepared is None:
            return [], []
        optimizers = [o for o in self._prepared.optimizers if isinstance(o.optimizer, MegatronOptimizer)]
        schedulers = [s for s in self._prepared.schedulers if isinstance(s.scheduler, MegatronScheduler)]
        return optimizers, schedulers

    # ---- state dicts and checkpoints -------------------------------------------------------
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The merged weights; a model prepared from a Hugging Face model gets its Hugging Face names and layout."""
        chunks = [self.unwrap(c) for c in parallel.chunks_of(model)]
        with self.redirect():
            state = checkpoint.full_state_dict(chunks)
        config = getattr(chunks[0], hf.HF_CONFIG, None)
        return state if config is None else hf.to_hf(state, config)

    def load_full_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
        config = getattr(self.unwrap(parallel.chunks_of(model)[0]), hf.HF_CONFIG, None)
        if config is not None and hf.is_hf_state_dict(state_dict):
            state_dict = hf.to_megatron(state_dict, config)
        for chunk in parallel.chunks_of(model):
            checkpoint.load_full_state_dict(self.unwrap(chunk), state_dict, strict=strict)

    def save_checkpoint_state(
        self, prepared: Prepared, ctx: RunContext, directory: Path, *, writer: bool, safe_serialization: bool
    ) -> list[str] | None:
        with self.redirect():
            return checkpoint.save(prepared, ctx, directory, optimizer_state=not self.plugin.no_save_optim)

    def load_checkpoint_state(self, prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> bool:
        with self.redirect():
            checkpoint.load(prepared, directory, strict=strict, optimizer_state=not self.plugin.no_load_optim)
        return True


def _is_megatron_module(model: nn.Module) -> bool:
    from megatron.core.transformer.module import MegatronModule

    return isinstance(model, MegatronModule)
