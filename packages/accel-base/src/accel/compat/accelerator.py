"""`Accelerator` members of Accelerate that sit outside accel's core loop (a base class of `Accelerator`).

Properties that read the configuration under Accelerate's names (`native_amp`,
`dispatch_batches`, `use_seedable_sampler`, the fp8 and profile handlers, ...),
`trigger_sync_in_backward`, `profile`, and the members for features accel does not have
(LOMO, DeepSpeed sequence parallelism), which say so when used.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .handlers import AORecipeKwargs, FP8RecipeKwargs, ProfileKwargs, TERecipeKwargs

if TYPE_CHECKING:
    from ..distributed.state import AcceleratorState
    from ..precision.fp8_request import FP8Request
    from ..settings.kwargs import DataLoaderConfiguration


class _EmptyWeakSetMarker:
    """Stands for an empty `weakref.WeakSet` in a pickled Accelerator (WeakSets do not pickle)."""

    def __reduce__(self) -> str:
        return "_EmptyWeakSet"


_EmptyWeakSet = _EmptyWeakSetMarker()


class AcceleratorCompatMixin:
    """Accelerate's `Accelerator` members that are not part of accel's training-loop core."""

    state: AcceleratorState
    dataloader_config: DataLoaderConfiguration
    kwargs_handlers: dict[type, Any]
    _fp8_request: FP8Request
    strategy: Any
    _tracker_hub: Any

    # ---- pickling (Accelerate's Accelerator pickles) -------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # Identity bookkeeping (weak references to this process's objects) cannot be pickled and means nothing
        # for the copies unpickling makes: it starts empty there.
        state = dict(self.__dict__)
        for key, value in state.items():
            if isinstance(value, weakref.WeakSet):
                state[key] = _EmptyWeakSet
            elif isinstance(value, dict) and any(
                isinstance(v, weakref.ref) or (isinstance(v, tuple) and any(isinstance(x, weakref.ref) for x in v))
                for v in value.values()
            ):
                state[key] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: (weakref.WeakSet() if v is _EmptyWeakSet else v) for k, v in state.items()})

    def __getattr__(self, name: str) -> Any:
        # Python calls this only on a miss: a name the adapter adds (`Adapter.accelerator_attributes`), else an
        # Accelerate member accel lacks (`compat_table.UNSUPPORTED_MEMBERS`) raises `AccelerateNameError` saying
        # why; a property whose getter failed re-raises its own error.
        from ..distributed.state import member_miss

        if "state" in self.__dict__ and not name.startswith("__"):
            try:
                adapter = self.state.adapter
            except AttributeError:  # a reset state: the miss below says so
                adapter = None
            extra = adapter.accelerator_attributes() if adapter is not None else {}
            if name in extra:
                return extra[name]

        raise member_miss(self, "Accelerator", name)

    # ---- configuration read back ---------------------------------------------------------
    @property
    def native_amp(self) -> bool:
        """Whether mixed precision runs through torch's autocast (fp16 or bf16)."""
        return str(self.state.mixed_precision) in ("fp16", "bf16")

    @property
    def multi_device(self) -> bool:
        """Whether this is a data-parallel run over several accelerator devices (False on CPUs, as in Accelerate)."""
        return bool(self.state.use_distributed) and self.state.device.type != "cpu"

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2; False under FSDP1 (`fsdp_version=1`) and for tensor
        parallelism alone."""
        return bool(self.state.is_fsdp2)

    @property
    def should_save_model(self) -> bool:
        """Whether this process takes part in saving the model (every process does; `save_model` decides who writes)."""
        return True

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def non_blocking(self) -> bool:
        return bool(self.dataloader_config.non_blocking)

    @property
    def use_seedable_sampler(self) -> bool:
        return bool(self.dataloader_config.use_seedable_sampler)

    @property
    def use_stateful_dataloader(self) -> bool:
        return bool(self.dataloader_config.use_stateful_dataloader)

    @property
    def log_with(self) -> list[Any]:
        """The trackers asked for with `log_with`."""
        return list(getattr(self._tracker_hub, "requested", []))

    # ---- handlers ---------------------------------------------------------------------------
    @property
    def profile_handler(self) -> ProfileKwargs | None:
        return self.kwargs_handlers.get(ProfileKwargs)

    @property
    def fp8_recipe_handler(self) -> FP8RecipeKwargs | None:
        return self.kwargs_handlers.get(FP8RecipeKwargs)

    @property
    def te_recipe_handler(self) -> TERecipeKwargs | None:
        return self.kwargs_handlers.get(TERecipeKwargs)

    @property
    def ao_recipe_handler(self) -> AORecipeKwargs | None:
        return self.kwargs_handlers.get(AORecipeKwargs)

    @property
    def msamp_recipe_handler(self) -> None:
        """Always None: MS-AMP is not supported."""
        return None

    @property
    def has_fp8_handler(self) -> bool:
        return any(h is not None for h in (self.fp8_recipe_handler, self.te_recipe_handler, self.ao_recipe_handler))

    @property
    def fp8_enabled(self) -> bool:
        return str(self.state.mixed_precision) == "fp8"

    @property
    def delayed_fp8_autocast(self) -> bool:
        return False

    @property
    def fp8_backend(self) -> str:
        """ "AO", "TE", "MSAMP" or "NO": the fp8 backend the recipe handler or the launcher (`ACCEL_FP8_BACKEND`)
        named; "NO" when neither did (the adapter then picks)."""
        backend = self._fp8_request.backend
        return backend.upper() if backend else "NO"

    # ---- parallelism --------------------------------------------------------------------------
    @property
    def torch_device_mesh(self) -> Any:
        """The strategy's device mesh (FSDP2), or None."""
        return getattr(self.strategy, "device_mesh", None)

    @property
    def parallelism_config(self) -> Any:
        """The `ParallelismConfig` of an N-D run (`Accelerator(parallelism_config=...)`), else None."""
        return getattr(self.strategy, "parallelism", None)  # type: ignore[attr-defined]

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return bool(self.is_fsdp2)  # type: ignore[attr-defined]

    def _mesh_rank(self, dim: str) -> int | None:
        pc, mesh = self.parallelism_config, self.torch_device_mesh
        if pc is None or mesh is None or dim not in (mesh.mesh_dim_names or ()):
            return None
        return int(mesh.get_local_rank(dim))

    @property
    def data_parallel_rank(self) -> int:
        if self.parallelism_config is not None:
            return self._mesh_rank("dp_replicate") or 0
        return int(self._data_shards()[1])  # type: ignore[attr-defined]

    @property
    def data_parallel_shard_rank(self) -> int:
        if self.parallelism_config is not None:
            return self._mesh_rank("dp_shard") or 0
        return int(self._data_shards()[1]) if self.is_fsdp2 else 0  # type: ignore[attr-defined]

    @property
    def tensor_parallel_rank(self) -> int:
        return self._mesh_rank("tp") or 0

    @property
    def context_parallel_rank(self) -> int:
        return self._mesh_rank("cp") or 0

    @property
    def pipeline_parallel_rank(self) -> int:
        return 0

    @property
    def deepspeed_plugin(self) -> Any:
        """The DeepSpeed plugin in use (strategy "deepspeed"), else None."""
        return (
            getattr(self.strategy, "plugin", None)
            if str(getattr(self.state, "strategy_name", "")) == "deepspeed"
            else None
        )

    @property
    def deepspeed_config(self) -> Any:
        plugin = self.deepspeed_plugin
        return getattr(plugin, "deepspeed_config", None) if plugin is not None else None

    @property
    def has_lomo_optimizer(self) -> bool:
        return False

    # ---- context managers --------------------------------------------------------------------
    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """Synchronise gradients in the next `backward` even inside `no_sync` (data-parallel models; else nothing)."""
        if not hasattr(model, "require_backward_grad_sync") or not hasattr(model, "reducer"):
            yield
            return
        ddp: Any = model
        saved = (ddp.require_backward_grad_sync, ddp.require_forward_param_sync)
        ddp.require_backward_grad_sync = True
        ddp.require_forward_param_sync = True
        # DDP skips its reducer's preparation under no_sync; this forward already ran, so prepare now.
        ddp.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            ddp.require_backward_grad_sync, ddp.require_forward_param_sync = saved

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with `torch.profiler` (settings: `profile_handler`, else the Accelerator's `ProfileKwargs`).

        With `output_trace_dir`, each process writes `profile_<r>.json` there when the block ends (the name
        Accelerate gives it, `PROFILE_PATTERN_NAME`).
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with handler.build(self.adapter.hardware_device_type) as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.state.process_index}.json"))
        self.state.wait_for_everyone()

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: Any = None,
    ) -> Iterator[None]:
        """Split `buffers` along `buffer_seq_dims` over the `cp` mesh dimension for the block (torch's
        `context_parallel`, on adapters that claim "cp" with `ParallelismConfig(cp_size>1)`); recreate it every
        step. Without context parallelism it does nothing (with a warning), as in Accelerate."""
        pc = self.parallelism_config
        if pc is None or not pc.cp_enabled:
            warnings.warn(
                "Context parallel training is not enabled. This context manager will have no effect. To enable it, "
                "set `parallelism_config.cp_size` > 1 in the `Accelerator` constructor.",
                stacklevel=3,
            )
            yield
            return
        from torch.distributed.tensor.experimental import context_parallel
        from torch.distributed.tensor.experimental._attention import set_rotate_method

        set_rotate_method(pc.cp_handler.cp_comm_strategy)
        with (
            self.adapter.context_parallel_kernels(),  # type: ignore[attr-defined]
            context_parallel(
                self.torch_device_mesh["cp"],
                buffers=buffers,
                buffer_seq_dims=buffer_seq_dims,
                no_restore_buffers=no_restore_buffers,
            ),
        ):
            yield

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        """Not supported: accel does not prepare LOMO optimizers."""
        raise NotImplementedError(
            "Accelerator.lomo_backward: LOMO optimizers are not supported by accel. Use accelerator.backward(loss) "
            "with a regular torch optimizer."
        )

    def deepspeed_ulysses_dl_adapter(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: accel's DeepSpeed strategy has no Ulysses sequence parallelism."""
        raise NotImplementedError(
            "Accelerator.deepspeed_ulysses_dl_adapter: DeepSpeed Ulysses sequence parallelism is not supported by "
            "accel. Train with strategy='deepspeed' without sequence parallelism."
        )
