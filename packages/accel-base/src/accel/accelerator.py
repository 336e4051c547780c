"""`Accelerator`: the training loop's API. It orchestrates; the adapter and strategy do the work.

The names and semantics are those of Accelerate's `Accelerator`, so a script
written for it runs with only the import changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from .adapter.base import Adapter
from .adapter.registry import get_strategy_class
from .checkpoint import state as ckpt
from .compat.accelerator import AcceleratorCompatMixin
from .compat.arguments import accelerator_settings
from .compat.handlers import check_fp8_handlers_used
from .compat.objects import adopt_tracker
from .data.loader import DataLoaderShard, prepare_data_loader, skip_first_batches
from .distributed import ops
from .distributed.state import AcceleratorState, DistributedType, GradientState
from .errors import AccelError, CheckpointError, StrategyNotSupportedError
from .precision.base import Precision, remove_autocast_wrapper
from .prepare.prepared import Prepared, RunContext
from .prepare.walk import PrepareWalk, check_device_map, verify_device_map
from .prepare.wrappers import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
    compile_settings,
    strip_compile,
    unwrap_through,
)
from .settings.accelerator import DEFAULT_GRADIENT_ACCUMULATION_STEPS, install_marker_default
from .settings.kwargs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .strategies.base import Strategy
from .strategies.parallelism_config import (
    bind_parallelism,
)
from .trackers.hub import TrackerHub


class Accelerator(AcceleratorCompatMixin):
    """One training loop for every accelerator.

    Args:
        device_placement: move prepared models and batches to `self.device`.
        split_batches: deprecated spelling of `DataLoaderConfiguration(split_batches=...)`.
        mixed_precision: "no", "bf16", "fp16" (with a grad scaler) or "fp8" (adapters that
            support it); default `ACCEL_MIXED_PRECISION` or "no".
        gradient_accumulation_steps: micro-batches per optimizer step under `accumulate` (default
            `ACCEL_GRADIENT_ACCUMULATION_STEPS`, else 1).

    An argument passed here wins over the launcher's variable for the same setting (`accel launch` flags,
    its config file, `accelerate launch`'s `ACCELERATE_*`), which wins over the built-in default; where the two
    disagree, one warning names both values (docs/launching.md, "Which value wins").
        cpu: force the built-in cpu adapter.
        adapter: name of the hardware adapter (default: `ACCEL_ADAPTER`, else the best
            available one).
        adapter_options: the adapter's own options by field name (see the adapter package's
            README, e.g. `{"use_regional_compilation": True}`); they win over its launch flags
            and environment variables. Unknown names are refused.
        emulate: run the adapter's code on the CPU with gloo (default `ACCEL_EMULATE`).
        strategy: "ddp" (default), "fsdp2", "deepspeed", or another registered strategy.
        dataloader_config, project_config, gradient_accumulation_plugin, dynamo_plugin:
            the configuration dataclasses.
        kwargs_handlers: `DistributedDataParallelKwargs`, `GradScalerKwargs`,
            `InitProcessGroupKwargs`, `AutocastKwargs`, ...
        log_with, project_dir: trackers and where checkpoints go.
        step_scheduler_with_optimizer: step prepared schedulers only with real optimizer steps.
        parallelism_config: an `accel.utils.ParallelismConfig` (data/tensor/context parallel sizes on one
            device mesh, composed on FSDP2; docs/parallelism.md).
        torch_tp_plugin: deprecated in Accelerate: run as `ParallelismConfig(tp_size=plugin.tp_size)`, with
            Accelerate's FutureWarning.
        deepspeed_plugins: `{name: DeepSpeedPlugin}`: one DeepSpeed engine per plugin (e.g. an RLHF actor and
            its frozen reference model). The first is active; `accelerator.state.select_deepspeed_plugin(name)`
            picks the one the next prepared model is built with (docs/deepspeed.md).

    Raises:
        ValueError: unknown precision, a precision the adapter lacks, or a kwargs handler
            given twice.
    """

    def __init__(
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,  # the marker default, installed below the class
        cpu: bool = False,
        dataloader_config: DataLoaderConfiguration | None = None,
        deepspeed_plugin: Any = None,
        fsdp_plugin: Any = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: list[str] | None = None,
        log_with: Any = None,
        project_dir: str | os.PathLike[str] | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: list[KwargsHandler] | None = None,
        dynamo_backend: str | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        deepspeed_plugins: Any = None,
        parallelism_config: Any = None,
        *,
        adapter: str | None = None,
        adapter_options: Mapping[str, Any] | None = None,
        emulate: bool | None = None,
        strategy: str | None = None,
        strategy_config: Any = None,
        even_batches: bool | None = None,
    ) -> None:
        # Every argument, translated once (Accelerate's spellings, the environment, the launcher's defaults).
        settings = accelerator_settings(**{k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self.ddp_handler: DistributedDataParallelKwargs | None = settings.ddp_handler
        self.scaler_handler: GradScalerKwargs | None = settings.scaler_handler
        self.init_handler: InitProcessGroupKwargs | None = settings.init_handler
        self.autocast_handler: AutocastKwargs | None = settings.autocast_handler
        self.kwargs_handlers = dict(settings.handlers)
        self._fp8_request = settings.fp8
        self.project_configuration = settings.project_config
        self.dataloader_config = settings.dataloader_config

        self.state = AcceleratorState(
            mixed_precision=settings.mixed_precision,
            cpu=settings.cpu,
            adapter=settings.adapter,
            emulate=settings.emulate,
            adapter_options=settings.adapter_options,
            strategy=settings.strategy,
            init_kwargs=self.init_handler,
            dynamo_plugin=settings.dynamo_plugin,
            env=settings.env,
            _from_accelerator=True,
        )
        self.strategy: Strategy = get_strategy_class(self.state.strategy_name)(settings.strategy_config)
        bind_parallelism(self.strategy, settings.parallelism_config, self.state)  # the N-D mesh, or a DDP run's config
        supported = self.adapter.capabilities.strategies
        if self.strategy.name not in supported:
            raise StrategyNotSupportedError(
                f"The {self.adapter.name!r} adapter does not support the {self.strategy.name!r} strategy; it supports "
                f"{sorted(supported)}. Pick one of those, or an adapter that supports {self.strategy.name!r}."
            )
        self.adapter.check_strategy(self.strategy.name)  # a strategy the adapter's options rule out
        compile_settings(self.adapter, self.state.dynamo_plugin)  # a compile it cannot run is refused now, by name
        # Called after every backward with whether it synchronises gradients; looked up once
        # so that strategies without the hook cost nothing per step.
        overridden = type(self.strategy).after_backward is not Strategy.after_backward
        self._asked_adapter_defaults: dict[str, Any] | None = None
        self._strategy_after_backward = self.strategy.after_backward if overridden else None
        use_distributed = self.state.use_distributed
        # AcceleratorState.deepspeed_plugin / fsdp_plugin / torch_tp_plugin read the strategy and the plugin.
        self.state.attach_strategy(
            self.strategy,
            distributed_type=self.strategy.distributed_type(use_distributed)
            or self.adapter.data_parallel_type(use_distributed),
            torch_tp_plugin=settings.torch_tp_plugin,
        )
        self.gradient_state = GradientState(gradient_accumulation_plugin=settings.gradient_accumulation_plugin)

        self.device_placement = settings.device_placement
        self.step_scheduler_with_optimizer = settings.step_scheduler_with_optimizer
        # Copied from rank 0 at every iteration of a prepared loader (accel.distributed.rng), as in Accelerate.
        self.rng_types = settings.rng_types
        # One precision object for the run; a strategy whose engine scales the fp16 loss itself
        # must not get a second scaler.
        self.precision = Precision.for_run(
            self.mixed_precision,
            self.adapter,
            loss_scaling=not self.strategy.owns_loss_scaling,
            scaler_kwargs=self.scaler_handler.to_kwargs() if self.scaler_handler else None,
            autocast_kwargs=_autocast_kwargs(self.autocast_handler),
        )
        self.precision.scaler = self.strategy.grad_scaler(self.precision.scaler)
        self.scaler = self.precision.scaler
        requested = settings.mixed_precision or settings.env.mixed_precision
        check_fp8_handlers_used(self.kwargs_handlers, requested, self.precision.fp8, self.strategy.name)

        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self.prepared = Prepared(scaler=self.scaler)
        """Every prepared object (the registry strategies and checkpoints receive)."""
        self._walk = PrepareWalk(
            prepared=self.prepared,
            context=self._run,
            placement_default=self._placement_default,
            check_placement=self._check_placement,
            scheduler_options=self._scheduler_options,
            allow_detached_optimizers=settings.env.allow_detached_optimizers,
        )
        """The prepare walk (`accel.prepare.walk`): `prepare` and `prepare_*` delegate to it."""
        self._tracker_hub = TrackerHub(
            settings.log_with, self.logging_dir, is_main_process=self.is_main_process, adopt=adopt_tracker
        )

    # ---- state ----------------------------------------------------------------------------
    @property
    def _models(self) -> list[torch.nn.Module]:
        return self.prepared.models

    @property
    def _optimizers(self) -> list[AcceleratedOptimizer]:
        return self.prepared.optimizers

    @property
    def _schedulers(self) -> list[AcceleratedScheduler]:
        return self.prepared.schedulers

    @property
    def _dataloaders(self) -> list[DataLoaderShard]:
        return self.prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self.prepared.custom_objects

    @property
    def _adapter_defaults(self) -> dict[str, Any]:
        """The adapter's defaults for the strategy, asked once, at the first `prepare`."""
        if self._asked_adapter_defaults is None:
            self._asked_adapter_defaults = dict(self.adapter.strategy_defaults(self.strategy.name))
        return self._asked_adapter_defaults

    def _run(self, **facts: Any) -> RunContext:
        """The frozen view of the run handed to the adapter, strategies and checkpoints; `facts`: those of the
        object being prepared or saved (`device_placement`, `evaluation_mode`, `optimizers`, ...)."""
        return RunContext(
            device=self.device,
            process_index=self.process_index,
            local_process_index=self.local_process_index,
            num_processes=self.num_processes,
            local_num_processes=self.state.launch.local_world_size if self.use_distributed else 1,
            is_main_process=self.is_main_process,
            is_local_main_process=self.is_local_main_process,
            use_distributed=self.use_distributed,
            backend=self.adapter.backend,
            mixed_precision=self.mixed_precision,
            autocast_kwargs=_autocast_kwargs(self.autocast_handler),
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            save_on_each_node=self.project_configuration.save_on_each_node,
            split_batches=self.split_batches,
            ddp_kwargs=self.ddp_handler,
            ddp_device_ids=self.adapter.ddp_device_ids(self.device),
            dynamo_plugin=self.state.dynamo_plugin,
            kwargs_handlers=self.kwargs_handlers,
            fp8=self._fp8_request,
            adapter_defaults=self._adapter_defaults,
            optimizer_on_host=self.strategy.optimizer_on_host(),
            adapter=self.adapter,
            strategy=self.strategy,
            precision=self.precision,
            **facts,
        )

    @property
    def adapter(self) -> Adapter:
        """The hardware adapter in use."""
        return self.state.adapter  # type: ignore[no-any-return]

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type  # type: ignore[no-any-return]

    @property
    def num_processes(self) -> int:
        return self.state.num_processes  # type: ignore[no-any-return]

    @property
    def process_index(self) -> int:
        return self.state.process_index  # type: ignore[no-any-return]

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index  # type: ignore[no-any-return]

    @property
    def device(self) -> torch.device:
        return self.state.device  # type: ignore[no-any-return]

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process  # type: ignore[no-any-return]

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process  # type: ignore[no-any-return]

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process  # type: ignore[no-any-return]

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed  # type: ignore[no-any-return]

    @property
    def mixed_precision(self) -> str:
        return self.state.mixed_precision  # type: ignore[no-any-return]

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_state.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        self.gradient_state.plugin_kwargs["num_steps"] = int(steps)

    @property
    def sync_gradients(self) -> bool:
        return self.gradient_state.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.gradient_state.set_sync_gradients(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last optimizer step was skipped (fp16 overflow)."""
        return any(opt.step_was_skipped for opt in self._optimizers)

    # ---- process helpers ---------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """Barrier across all processes."""
        self.state.wait_for_everyone()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the local main process only."""
        self.state.print(*args, **kwargs)

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        return self.state.partial.split_between_processes(inputs, apply_padding=apply_padding)  # type: ignore[no-any-return]

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.partial.main_process_first()  # type: ignore[no-any-return]

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.partial.local_main_process_first()  # type: ignore[no-any-return]

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.partial.on_main_process(function)  # type: ignore[no-any-return]

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.partial.on_local_main_process(function)  # type: ignore[no-any-return]

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.partial.on_last_process(function)  # type: ignore[no-any-return]

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        return self.state.partial.on_process(function, process_index=process_index)

    def on_local_process(
        self, function: Callable[..., Any] | None = None, local_process_index: int | None = None
    ) -> Any:
        return self.state.partial.on_local_process(function, local_process_index=local_process_index)

    # ---- prepare --------------------------------------------------------------------------
    def _placement_default(self) -> bool:
        return self.device_placement

    def _scheduler_options(self) -> dict[str, Any]:
        return {
            "step_with_optimizer": self.step_scheduler_with_optimizer,
            "split_batches": self.split_batches,
            "num_data_shards": self._data_shards()[0],
        }

    def _check_placement(self, model: torch.nn.Module, placement: bool) -> bool:
        placement = check_device_map(model, placement, self.distributed_type, self.device)
        if placement and getattr(self.strategy, "materialises_meta_models", False):
            # A model built on the meta device (ranks > 0 under cpu_ram_efficient_loading): the strategy fills it.
            placement = not any(p.is_meta for p in model.parameters())
        return placement

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, data loaders and schedulers, in any order (the walk:
        `accel.prepare.walk`).

        Returns the prepared objects in the order given (one object alone is returned
        as is). Objects already prepared are returned unchanged.

        Raises:
            ValueError: `device_placement` is not one flag per object; a model loaded with a
                multi-device `device_map` in distributed mode; the strategy's own rules.
        """
        placements: list[bool | None]
        if device_placement is None:
            # None per object: each takes the Accelerator's default, and adapters can tell it
            # from an explicit request (`RunContext.device_placement_requested`).
            placements = [None] * len(args)
        elif len(device_placement) != len(args):
            raise ValueError(
                f"`device_placement` should be a list with {len(args)} elements (the number of objects passed)."
            )
        else:
            self.strategy.validate_device_placement(device_placement)
            placements = list(device_placement)
        result = self._walk.prepare(
            args, placements, lambda loader, placement: self.prepare_data_loader(loader, device_placement=placement)
        )
        steps = self.strategy.accumulation_steps()
        if steps is not None:  # an engine that fixes the count itself (DeepSpeed's config)
            self.gradient_accumulation_steps = steps
        return result[0] if len(result) == 1 else tuple(result)

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False
    ) -> torch.nn.Module:
        """Place, set precision, apply the strategy and compile one model (the walk's model steps).

        `evaluation_mode=True` prepares for inference only: no strategy wrapper.

        Raises:
            ValueError: for quantized (8-bit/4-bit) or `device_map` models Accelerate
                also refuses, with the same messages.
        """
        return self._walk.prepare_model(model, device_placement, evaluation_mode)

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> AcceleratedOptimizer:
        """Wrap an optimizer so it steps with accumulation and the grad scaler."""
        return self._walk.prepare_optimizer(optimizer, device_placement)

    def prepare_scheduler(self, scheduler: Any) -> AcceleratedScheduler:
        """Wrap a scheduler so it steps only with real optimizer steps."""
        return self._walk.prepare_scheduler(scheduler)

    def prepare_data_loader(
        self, data_loader: DataLoader, device_placement: bool | None = None, slice_fn_for_dispatch: Any = None
    ) -> DataLoaderShard:  # type: ignore[type-arg]
        """Shard a data loader over the processes (see `accel.data`)."""
        if device_placement is None:
            device_placement = self.device_placement
        config = self.dataloader_config
        num_shards, shard_index = self._data_shards()
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            put_on_device=device_placement,
            num_processes=num_shards,
            process_index=shard_index,
            split_batches=config.split_batches,
            even_batches=config.even_batches,
            dispatch_batches=config.dispatch_batches,
            slice_fn_for_dispatch=slice_fn_for_dispatch,
            rng_types=list(self.rng_types),
            comm_device=self.device,
            data_seed=config.data_seed,
            use_seedable_sampler=config.use_seedable_sampler,
            non_blocking=config.non_blocking,
            gradient_state=self.gradient_state,
            stateful=config.use_stateful_dataloader,
            extra_kwargs=self.adapter.prepare_data_loader_kwargs(
                self._run(device_placement=device_placement, data_loader=data_loader)
            ),
        )
        self._dataloaders.append(prepared)
        return prepared

    def _data_parallel_group(self) -> Any:
        """The processes that hold different data: the strategy's group of model replicas, else the adapter's
        (its own sequence parallelism), else None (every process)."""
        group = self.strategy.data_parallel_group()
        return self.adapter.data_parallel_group() if group is None else group

    def _data_shards(self) -> tuple[int, int]:
        """(number of data shards, this process's shard): one per process unless the strategy groups
        processes into model replicas (`Strategy.data_parallel_group`) or the adapter has several share a
        batch (`Adapter.data_parallel_group`)."""
        group = self._data_parallel_group()
        if group is None or not self.use_distributed:
            return self.num_processes, self.process_index
        import torch.distributed as dist

        return dist.get_world_size(group), dist.get_rank(group)

    def skip_first_batches(self, dataloader: DataLoaderShard, num_batches: int = 0) -> DataLoaderShard:
        """Resume mid-epoch: skip the `num_batches` batches of the current epoch already seen."""
        return skip_first_batches(dataloader, num_batches)

    # ---- the step -----------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """`loss.backward()`, divided by the accumulation steps and scaled under fp16."""
        if self.gradient_state.num_steps > 1 and self.strategy.scales_loss_for_accumulation:
            loss = loss / self.gradient_state.num_steps
        loss = self.precision.scale_loss(loss)
        if not self.strategy.backward(loss, sync=self.gradient_state.sync_gradients, **kwargs):
            loss.backward(**kwargs)  # a version-1 strategy that leaves the plain backward to the core
        self.adapter.after_backward()
        if self._strategy_after_backward is not None:
            self._strategy_after_backward(self.gradient_state.sync_gradients)

    def _do_sync(self) -> None:
        gs = self.gradient_state
        if gs.sync_with_dataloader and gs.end_of_dataloader:
            self.step = 0
            gs.set_sync_gradients(True)
        else:
            self.step += 1
            gs.set_sync_gradients((self.step % gs.num_steps) == 0)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation for `model` inside the block."""
        with self.strategy.no_sync(model):
            yield

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Accumulate gradients over `gradient_accumulation_steps` micro-batches.

        Gradients are synchronised (and prepared optimizers step) only on the last
        micro-batch of each group and at the end of the data loader.
        """
        self._do_sync()
        allow = self.sync_gradients or self.gradient_state.sync_each_batch
        with contextlib.ExitStack() as stack:
            if not allow:
                for m in models:
                    stack.enter_context(self.strategy.no_sync(m))
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Train on uneven inputs: ranks that run out of batches shadow the others' collectives.

        `joinables` are prepared DDP models (and optimizers that support joining).
        `even_batches` overrides the prepared loaders' setting inside the block (False lets
        ranks see different numbers of batches; loaders of iterable datasets keep theirs, with a
        warning). With one process this does nothing; with models that cannot join (FSDP,
        DeepSpeed, ...) it warns and does nothing, as Accelerate does.
        """
        if not self.use_distributed:
            yield
            return
        from torch.distributed.algorithms.join import Join, Joinable

        if self.distributed_type in _NO_JOIN or not all(isinstance(j, Joinable) for j in joinables):
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU (DDP-style data-parallel) training; "
                f"these models ({self.distributed_type.value}) cannot join, so `join_uneven_inputs` has no effect.",
                UserWarning,
                stacklevel=3,
            )
            yield
            return
        saved = [(dl, dl.even_batches) for dl in self._dataloaders if _is_map_style(dl)]
        if even_batches is not None:
            if len(saved) < len(self._dataloaders):
                warnings.warn(
                    "Overriding even_batches is only supported for map-style datasets, yet some dataloaders given "
                    "were iterable: they keep their setting.",
                    UserWarning,
                    stacklevel=3,
                )
            for dl, _ in saved:
                dl.even_batches = even_batches
        try:
            with Join(joinables, enable=True, throw_on_early_termination=False):
                yield
        finally:
            for dl, value in saved:
                dl.even_batches = value

    @contextlib.contextmanager
    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> Iterator[None]:
        """Run the block under the Accelerator's mixed precision."""
        with self.precision.forward_context(_autocast_kwargs(autocast_handler or self.autocast_handler)):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        """Divide gradients by the fp16 loss scale (done for you by the clip methods)."""
        if self.scaler is None or not self.sync_gradients:
            return
        optimizers = (
            optimizer if isinstance(optimizer, (list, tuple)) else [optimizer] if optimizer else self._optimizers
        )
        for opt in optimizers:
            inner = opt.optimizer if isinstance(opt, AcceleratedOptimizer) else opt
            self.precision.unscale_(inner)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the global gradient norm; returns the norm before clipping."""
        self.unscale_gradients()
        params = list(parameters)
        handled = self.strategy.clip_grad_norm_(params, max_norm, norm_type)
        if handled is not None:
            return handled
        return self.adapter.clip_grad_norm_(params, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        """Clip each gradient element to [-clip_value, clip_value]."""
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # ---- collectives ----------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Concatenate tensors from every process along dim 0."""
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """`gather` over the data-parallel processes, minus the samples that `even_batches`
        padding added to the last batch."""
        all_tensors = all(isinstance(t, torch.Tensor) for t in ops._tensors(input_data)) and bool(
            ops._tensors(input_data)
        )
        use_gather_object = use_gather_object or not all_tensors
        group = self._data_parallel_group()
        data = ops.gather_object(input_data, group=group) if use_gather_object else ops.gather(input_data, group=group)
        gs = self.gradient_state
        if not (gs.end_of_dataloader and gs.remainder > 0):
            return data
        if use_gather_object:
            return data[: gs.remainder]
        return ops.recursively_apply(lambda t: t[: gs.remainder], data)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce tensors ("sum", "mean", "max", "min" or "none"), times `scale`, over the data-parallel
        processes (every process unless the strategy splits models over several)."""
        return ops.reduce(tensor, reduction, scale, group=self._data_parallel_group())

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        return ops.broadcast(tensor, from_process=from_process)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Pad tensors along `dim` to the largest size across processes (a nested tensor: as is, with a warning)."""
        return ops.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def set_trigger(self) -> None:
        """Raise a flag on this process that `check_trigger` sees on all of them."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process if any process called `set_trigger` (then the flag is cleared)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        flag = ops.reduce(self.flag_tensor, reduction="sum")
        if int(flag.item()) >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    # ---- models -----------------------------------------------------------------------------
    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
    ) -> torch.nn.Module:
        """The user's module out of every wrapper (strategy, compile, fp32-output).

        With `keep_fp32_wrapper=False` the mixed-precision forward is removed as well.
        """
        inner = unwrap_through(model, self.strategy, keep_torch_compile=keep_torch_compile)
        if not keep_fp32_wrapper:
            remove_autocast_wrapper(inner)
        return inner

    def verify_device_map(self, model: torch.nn.Module) -> bool:
        """Whether `model` (or a submodule) was loaded with a `device_map` spanning several devices."""
        return verify_device_map(model)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full state dict of `model` (gathered if it is sharded). Call it on every process."""
        if not unwrap:
            return model.state_dict()
        return self.strategy.full_state_dict(strip_compile(model))

    def _load_model_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> None:
        self.strategy.load_full_state_dict(strip_compile(model), state_dict, strict=strict)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | os.PathLike[str],
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Write `model`'s full weights to `save_directory` as safetensors (sharded above `max_shard_size`).

        The files load into a plain, unwrapped module with `safetensors.torch.load_file`.
        Call it on every process; only the main process writes.
        """
        state_dict = self.get_state_dict(model)
        if self.is_main_process:
            ckpt.write_model_files(
                state_dict, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization
            )
        self.wait_for_everyone()

    def save(self, obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
        """Save `obj` from the main process only (safetensors when `safe_serialization`)."""
        if not self.is_main_process:
            return
        if safe_serialization:
            ckpt.save_safetensors(obj, f)
        else:
            ckpt.save_torch(obj, f)

    def free_memory(self, *objects: Any) -> list[Any]:
        """Drop every reference the Accelerator holds, collect garbage, empty the device cache.

        Returns `objects` as a list of None, to rebind: `model, opt = accelerator.free_memory(model, opt)`.
        """
        self.prepared.clear()
        self.step = 0
        gc.collect()
        self.adapter.empty_cache()
        return [None for _ in objects]

    def clear(self, *objects: Any) -> list[Any]:
        """Alias of `free_memory`."""
        return self.free_memory(*objects)

    # ---- checkpoints ----------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Include objects with `state_dict`/`load_state_dict` in `save_state`/`load_state`."""
        invalid = [
            f"\t- Item at index {i}, `{type(o).__name__}`"
            for i, o in enumerate(objects)
            if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))
        ]
        if invalid:
            raise ValueError(
                "All `objects` must include a `state_dict` and `load_state_dict` function to be stored. "
                "The following inputs are invalid:\n" + "\n".join(invalid)
            )
        self._custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Call `hook(models, weights, output_dir)` before `save_state` writes."""
        return _HookHandle(self.prepared.save_state_pre_hooks, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """Call `hook(models, input_dir)` before `load_state` reads."""
        return _HookHandle(self.prepared.load_state_pre_hooks, hook)

    def save_state(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        safe_serialization: bool = True,
        *,
        async_save: bool = False,
        **save_model_func_kwargs: Any,
    ) -> str:
        """Save models, optimizers, schedulers, scaler, data positions, RNG and registered objects.

        With `ProjectConfiguration(automatic_checkpoint_naming=True)` and no `output_dir`, writes
        `<project_dir>/checkpoints/checkpoint_<n>` and prunes beyond `total_limit`. The
        directory appears only once complete. Returns its path.

        `async_save=True` (an accel extension) returns as soon as every state is copied to host
        memory; the main process writes, hashes and commits the files on a background thread while
        training goes on. The next `save_state` or `load_state` waits for it, and so does the process
        at exit; a failure is raised there (on every process), naming the checkpoint, or printed at exit.
        A process killed meanwhile leaves the previous checkpoint intact.

        `save_model_func_kwargs` go to the engine's own save where a strategy has one (DeepSpeed's
        `save_checkpoint`, e.g. `exclude_frozen_parameters=True`), as in Accelerate; elsewhere they are
        ignored with a warning naming them (Accelerate ignores them silently).
        """
        cfg = self.project_configuration
        if cfg.automatic_checkpoint_naming:
            if cfg.project_dir is None:
                raise ValueError("automatic_checkpoint_naming needs `project_dir` in ProjectConfiguration.")
            output_dir = Path(cfg.project_dir) / "checkpoints" / f"checkpoint_{cfg.iteration}"
            if ckpt.is_complete(output_dir):
                raise ValueError(
                    f"Checkpoint directory {output_dir} ({cfg.iteration}) already exists. "
                    "Please manually override `self.save_iteration` with what iteration to start with."
                )
        elif output_dir is None:
            raise ValueError(
                "save_state needs `output_dir` (or ProjectConfiguration(automatic_checkpoint_naming=True))."
            )
        run = self._run()
        if save_model_func_kwargs:
            taken = sorted(set(self.strategy.reserved_save_kwargs) & set(save_model_func_kwargs))
            if taken:
                raise ValueError(
                    f"save_state({', '.join(f'{k}=...' for k in taken)}): accel sets these for the "
                    f"{self.strategy.name!r} strategy's save itself (the checkpoint's directory and tags, so that "
                    "load_state finds them); drop them."
                )
            if self.strategy.takes_save_kwargs:
                run = dataclasses.replace(run, save_model_kwargs=dict(save_model_func_kwargs))
            else:
                warnings.warn(
                    f"save_state ignores {sorted(save_model_func_kwargs)}: the {self.strategy.name!r} strategy has "
                    "no model save function to pass them to (Accelerate passes them to DeepSpeed's save_checkpoint only).",
                    UserWarning,
                    stacklevel=2,
                )
        # Pruned only after the new checkpoint is complete (committed, with `async_save` in the background):
        # a crash mid-save must leave the previous one loadable.
        project_dir, limit = cfg.project_dir, cfg.total_limit
        prune = None
        if cfg.automatic_checkpoint_naming and limit is not None and project_dir is not None:

            def prune() -> None:
                ckpt.prune(project_dir, limit)

        path = ckpt.save_state(
            self.prepared,
            run,
            output_dir,
            step=self.step,
            safe_serialization=safe_serialization,
            async_save=async_save,
            after_commit=prune if self.is_main_process else None,
        )
        if cfg.automatic_checkpoint_naming:
            self.wait_for_everyone()
            cfg.iteration += 1
        return str(path)

    def load_state(
        self,
        input_dir: str | os.PathLike[str] | None = None,
        load_kwargs: dict[str, Any] | None = None,
        strict: bool = True,
        **load_model_func_kwargs: Any,
    ) -> None:
        """Restore everything `save_state` saved. With no `input_dir`, the latest complete automatic checkpoint.

        A folder written by Accelerate 1.15's `save_state` (one process, DDP, FSDP2 full or sharded) loads too,
        its pickled files read without running code (`accel.checkpoint.accelerate_layout`; docs/checkpoints.md).

        Accelerate's extra arguments, as far as accel's loader can honour them: `map_location` ("cpu",
        "on_device" or None; states are read on the host and each optimizer moves its state to its parameters'
        device, which is where both choices end up); `load_kwargs={"weights_only": True}` (what accel always
        does). Keywords the strategy's engine load takes go there, as Accelerate passes them to DeepSpeed's
        `load_checkpoint` (`load_optimizer_states=False`, `load_module_only=True`, ...: `Strategy.takes_load_kwargs`).
        accel never unpickles arbitrary objects, so `weights_only=False` is refused, and so is anything else in
        `load_kwargs` or any other keyword (Accelerate hands those to `torch.load` and the model loader).

        Raises:
            CheckpointError: no checkpoint, an incomplete one, or a damaged or unsafe file.
            TypeError: a `map_location` other than "cpu", "on_device" or None (Accelerate's error).
            UnsupportedLoadArgumentError: `weights_only=False` or another argument accel cannot honour.
        """
        engine_kwargs = {
            k: load_model_func_kwargs.pop(k) for k in self.strategy.takes_load_kwargs & set(load_model_func_kwargs)
        }
        _check_load_arguments(load_kwargs, load_model_func_kwargs)
        cfg = self.project_configuration
        number: int | None
        if input_dir is None:
            if not cfg.automatic_checkpoint_naming or cfg.project_dir is None:
                raise ValueError(
                    "load_state needs `input_dir` unless ProjectConfiguration(automatic_checkpoint_naming=True)."
                )
            ckpt.background.wait()  # the latest checkpoint may still be being saved in the background
            found = ckpt.list_checkpoints(cfg.project_dir)
            if not found:
                raise CheckpointError(f"No complete checkpoint under {Path(cfg.project_dir) / 'checkpoints'}.")
            number, input_dir = found[-1]
        else:
            number = ckpt.checkpoint_number(input_dir)
        run = dataclasses.replace(self._run(), load_model_kwargs=engine_kwargs) if engine_kwargs else self._run()
        manifest = ckpt.load_state(self.prepared, run, input_dir, strict=strict)
        self.step = int(manifest.get("step", 0))
        if cfg.automatic_checkpoint_naming and number is not None:
            # Continue numbering after the loaded checkpoint instead of colliding with it.
            cfg.iteration = number + 1
        self.wait_for_everyone()

    # ---- trackers --------------------------------------------------------------------------
    @property
    def trackers(self) -> list[Any]:
        """The active trackers (empty on processes that do not log)."""
        return list(self._tracker_hub.active)

    def init_trackers(
        self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: dict[str, Any] | None = None
    ) -> None:
        """Start the trackers named in `log_with` (main process only)."""
        self._tracker_hub.init(project_name, config, init_kwargs or {})

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Log scalars to every tracker (main process only)."""
        self._tracker_hub.log(values, step=step, log_kwargs=log_kwargs or {})

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        return self._tracker_hub.get(name, unwrap=unwrap)

    def end_training(self) -> None:
        """Close the trackers and wait for every process."""
        self._tracker_hub.finish()
        self.wait_for_everyone()

    def __repr__(self) -> str:
        return f"Accelerator(adapter={self.adapter.describe()!r}, num_processes={self.num_processes}, mixed_precision={self.mixed_precision!r})"


# `gradient_accumulation_steps` left out is a marker equal to 1, so that only a value passed in code wins over
# the launcher's (docs/launching.md, "Which value wins"); the signature shows the plain 1.
install_marker_default(Accelerator.__init__, "gradient_accumulation_steps", DEFAULT_GRADIENT_ACCUMULATION_STEPS)


class _HookHandle:
    _next_id = 0

    def __init__(self, hooks: dict[int, Callable[..., Any]], hook: Callable[..., Any]) -> None:
        self.hooks = hooks
        self.id = _HookHandle._next_id
        _HookHandle._next_id += 1
        hooks[self.id] = hook

    def remove(self) -> None:
        self.hooks.pop(self.id, None)


_NO_JOIN = (DistributedType.FSDP, DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)


def _is_map_style(loader: Any) -> bool:
    from torch.utils.data import IterableDataset

    from .data.dispatch import DataLoaderDispatcher

    return not isinstance(loader, DataLoaderDispatcher) and not isinstance(loader.dataset, IterableDataset)


class UnsupportedLoadArgumentError(AccelError, TypeError):
    """An argument of Accelerate's `load_state` that accel's checkpoint loader cannot honour."""


def _check_load_arguments(load_kwargs: Mapping[str, Any] | None, model_kwargs: dict[str, Any]) -> None:
    """Refuse what `load_state` cannot honour of Accelerate's `load_kwargs` / `**load_model_func_kwargs`."""
    map_location = model_kwargs.pop("map_location", None)
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or `'on_device'`"
        )
    load_kwargs = dict(load_kwargs or {})
    if load_kwargs.pop("weights_only", True) is not True:
        raise UnsupportedLoadArgumentError(
            "load_state(load_kwargs={'weights_only': False}): accel never unpickles arbitrary objects from a "
            "checkpoint (tensors are read with safetensors, other states with `torch.load(weights_only=True)`), so "
            "it cannot load what only a full unpickle could. Drop `weights_only` (or pass True); a state that is "
            "not plain tensors, numbers and containers belongs in an object registered with "
            "`register_for_checkpointing` that returns such a `state_dict()`."
        )
    refused = [f"load_kwargs[{k!r}]" for k in sorted(load_kwargs)] + [f"{k}=" for k in sorted(model_kwargs)]
    if refused:
        raise UnsupportedLoadArgumentError(
            f"load_state: {', '.join(refused)} cannot be honoured by accel's checkpoint loader (Accelerate hands "
            "them to `torch.load` and to the model's loader; accel reads its own verified files with safetensors "
            "and a weights-only `torch.load`). It accepts `strict=`, `map_location=` ('cpu', 'on_device' or None) "
            "and `load_kwargs={'weights_only': True}`; remove the others."
        )


def _autocast_kwargs(handler: AutocastKwargs | None) -> dict[str, Any]:
    if handler is None:
        return {}
    kwargs: dict[str, Any] = {"enabled": handler.enabled}
    if handler.cache_enabled is not None:
        kwargs["cache_enabled"] = handler.cache_enabled
    return kwargs
