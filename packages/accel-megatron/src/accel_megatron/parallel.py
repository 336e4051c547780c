"""Megatron-core's parallel state, models built from a provider, and its DDP wrapper."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import cuda_redirect
from .plugin import MegatronConfigError, MegatronPlugin


class ModelProvider(nn.Module):
    """A model that `prepare` builds once megatron-core's parallel state exists.

    `ModelProvider(fn)` where `fn(pre_process: bool, post_process: bool) -> MegatronModule`
    builds this process's pipeline stage (`pre_process`: it holds the embedding,
    `post_process`: it holds the output layer), the convention of megatron-core's
    training scripts. Pass it to `accelerator.prepare`; you get the built, wrapped model
    back, then create the optimizer from its parameters.
    """

    def __init__(self, fn: Callable[..., nn.Module]) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"ModelProvider needs a callable fn(pre_process, post_process); got {type(fn).__name__}.")
        self.fn = fn

    def build(self) -> list[nn.Module]:
        """This process's model chunks: one stage, or one per virtual stage under the interleaved
        schedule (then `fn` is called with `vp_stage=i` as well, megatron-core's convention)."""
        from megatron.core import parallel_state

        virtual = parallel_state.get_virtual_pipeline_model_parallel_world_size()
        if not virtual:
            stages = [
                self.fn(
                    pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=True),
                    post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=True),
                )
            ]
        else:
            stages = [
                self.fn(
                    pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=i),
                    post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=i),
                    vp_stage=i,
                )
                for i in range(virtual)
            ]
        for model in stages:
            if not isinstance(model, nn.Module):
                raise TypeError(f"The model provider returned {type(model).__name__}, not a torch.nn.Module.")
        return stages


class ModelChunks(nn.Module):
    """This process's model chunks under the interleaved (virtual) pipeline schedule, as one prepared model.

    `chunks[i]` is virtual stage i, wrapped in megatron-core's DDP. Run it with
    `accelerator.strategy.train_step`; `parameters()` covers every chunk.
    """

    def __init__(self, chunks: list[nn.Module]) -> None:
        super().__init__()
        self.chunks = nn.ModuleList(chunks)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "An interleaved pipeline model runs through `accelerator.strategy.train_step(model, batch, forward_fn, "
            "loss_fn)`, not by calling it."
        )


def chunks_of(model: nn.Module) -> list[nn.Module]:
    """The model chunks a prepared model stands for (itself, unless it is `ModelChunks`)."""
    return list(model.chunks) if isinstance(model, ModelChunks) else [model]


def initialize(plugin: MegatronPlugin, device: torch.device, backend: str) -> None:
    """Set up megatron-core's parallel state on the launched world, once.

    One process without a launcher gets a one-process group on `backend`: megatron-core
    builds its groups even then.

    Raises:
        MegatronConfigError: the world size does not fit the plugin, or parallel state
            already exists with other sizes.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state

    if plugin.num_layers_per_virtual_pipeline_stage and not plugin.virtual_pipeline_model_parallel_size:
        raise MegatronConfigError(
            "Set MegatronPlugin(virtual_pipeline_model_parallel_size=...) (model chunks per pipeline process) or give "
            "the layer count, other_megatron_args={'num_layers': N}: the parallel state is built before the model, "
            "so the model cannot tell it."
        )
    world = dist.get_world_size() if dist.is_initialized() else 1
    plugin.validate(world, device.type)
    if not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        sizes = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
        )
        if sizes != (plugin.tp_degree, plugin.pp_degree, plugin.cp_degree):
            raise MegatronConfigError(
                f"megatron-core's parallel state already exists with (tp, pp, cp) = {sizes}, not "
                f"{(plugin.tp_degree, plugin.pp_degree, plugin.cp_degree)}; call "
                "megatron.core.parallel_state.destroy_model_parallel() first."
            )
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=plugin.tp_degree,
            pipeline_model_parallel_size=plugin.pp_degree,
            virtual_pipeline_model_parallel_size=plugin.virtual_pipeline_model_parallel_size,
            context_parallel_size=plugin.cp_degree,
            expert_model_parallel_size=plugin.expert_model_parallel_size,
            expert_tensor_parallel_size=plugin.expert_tensor_parallel_size,
        )
    # megatron-core's own setup seeds the default generator identically everywhere: parameters
    # every tensor-parallel rank holds a copy of (norms, position embeddings) must start equal.
    torch.manual_seed(plugin.seed)
    if device.type == "cuda":
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(plugin.seed)
    else:
        cuda_redirect.install(plugin.seed)


def model_config(model: nn.Module) -> Any:
    """The `TransformerConfig` (a `ModelParallelConfig`) a megatron-core model was built with.

    Raises:
        TypeError: the model is not a megatron-core module.
    """
    from megatron.core.transformer.module import MegatronModule

    config = getattr(model, "config", None)
    if not isinstance(model, MegatronModule) or config is None:
        raise TypeError(
            f"The megatron strategy prepares megatron-core models (a MegatronModule such as GPTModel) or an "
            f"accel_megatron.ModelProvider; got {type(model).__name__}. Build the model from megatron-core's "
            "layers with `TransformerConfig(**plugin.transformer_config_kwargs(), ...)`."
        )
    return config


def check_config(config: Any, plugin: MegatronPlugin, model: nn.Module | None = None) -> None:
    """The model must be built for the layout the plugin set up, and with every model field the plugin
    sets (recomputation, dropouts, attention options, `other_megatron_args`, rotary embeddings): a
    plugin field is never accepted without effect."""
    wanted = {
        "tensor_model_parallel_size": plugin.tp_degree,
        "pipeline_model_parallel_size": plugin.pp_degree,
        "sequence_parallel": plugin.sequence_parallelism,
        "virtual_pipeline_model_parallel_size": plugin.virtual_pipeline_model_parallel_size,
        **plugin.model_fields(),
    }
    wrong = {k: (getattr(config, k, None), v) for k, v in wanted.items() if getattr(config, k, None) != v}
    rope = plugin.gpt_model_kwargs().get("position_embedding_type")
    built = getattr(model, "position_embedding_type", None)
    if rope is not None and built is not None and built != rope:
        wrong["position_embedding_type"] = (built, rope)
    if wrong:
        detail = ", ".join(f"{k}={got} (plugin: {want})" for k, (got, want) in wrong.items())
        raise MegatronConfigError(
            f"The model was built with {detail}. Build its TransformerConfig with "
            "`**plugin.transformer_config_kwargs()` (and a GPTModel with `**plugin.gpt_model_kwargs()`) so it "
            "matches the MegatronPlugin."
        )


def half_precision(model: nn.Module, mixed_precision: str) -> nn.Module:
    """Under `mixed_precision` "bf16"/"fp16": the model in megatron-core's `Float16Module`.

    Its parameters become bf16/fp16 (the optimizer keeps fp32 main copies), the first stage's
    floating inputs are cast down and the last stage's outputs back to fp32; the model's
    `TransformerConfig` gets `bf16`/`fp16` (and the pipeline dtype) set, as megatron-core's
    training loop does from `--bf16`/`--fp16`. Otherwise the model is returned unchanged.
    """
    if mixed_precision not in ("bf16", "fp16"):
        return model
    from megatron.core.transformer.module import Float16Module

    config = model_config(model)
    config.bf16 = mixed_precision == "bf16"
    config.fp16 = mixed_precision == "fp16"
    dtype = torch.bfloat16 if config.bf16 else torch.float16
    config.params_dtype = dtype
    if config.pipeline_model_parallel_size > 1:
        config.pipeline_dtype = dtype
    return Float16Module(config, model)


def wrap_ddp(model: nn.Module, plugin: MegatronPlugin, device: torch.device, *, first_chunk: bool = True) -> nn.Module:
    """megatron-core's DistributedDataParallel over the data-parallel group (contiguous grad buffers;
    bucketed for the first model chunk only, as megatron-core's training loop does)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=plugin.overlap_grad_reduce,
        use_distributed_optimizer=plugin.use_distributed_optimizer,
        bucket_size=plugin.bucket_size,
    )
    if device.type != "cuda" and cuda_redirect.redirect_moe_layers(model):
        model._accel_moe = True  # type: ignore[assignment]  # its backward runs redirected as well
    with on_device(device):
        return DistributedDataParallel(
            config=model_config(model), ddp_config=ddp_config, module=model, disable_bucketing=not first_chunk
        )


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Where megatron-core's CUDA-only lookups go: nowhere else on CUDA, the CPU otherwise."""
    return contextlib.nullcontext() if device.type == "cuda" else cuda_redirect.redirected()
