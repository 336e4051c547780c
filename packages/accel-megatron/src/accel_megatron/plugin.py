"""`MegatronPlugin`: how megatron-core splits a model over processes, checked against the world."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accel.errors import AccelError


class MegatronConfigError(AccelError, ValueError):
    """A `MegatronPlugin` that cannot run on this world size or with this model."""


@dataclass(kw_only=True)
class MegatronPlugin:
    """Megatron-core parallelism for `Accelerator(megatron_lm_plugin=MegatronPlugin(...))`.

    The world is split as data x pipeline x context x tensor parallel; the data-parallel
    size is what is left, `world_size // (tp_degree * pp_degree * cp_degree)`. Field names
    follow Accelerate's `MegatronLMPlugin` where it has one.
    """

    tp_degree: int = 1
    """Tensor-parallel size: every weight matrix is split over this many processes. Cuts
    weight and activation memory per process; costs an all-reduce per layer in forward and
    in backward."""
    pp_degree: int = 1
    """Pipeline-parallel size: consecutive layers live on different processes. Cuts weight
    memory; costs the pipeline bubble unless `num_micro_batches` is well above it."""
    cp_degree: int = 1
    """Context-parallel size: the sequence is split over this many processes in attention
    (megatron-core needs Transformer Engine for it; on CPU only 1 runs)."""
    sequence_parallelism: bool = False
    """Split layer-norm and dropout activations along the sequence over the tensor-parallel
    group (needs tp_degree > 1): less activation memory, same communication volume."""
    num_layers_per_virtual_pipeline_stage: int | None = None
    """Interleaved pipeline: each process holds several non-consecutive chunks of this many
    layers. Smaller bubble, more point-to-point messages. Needs pp_degree > 1 and, since the
    parallel state exists before the model, `virtual_pipeline_model_parallel_size` as well."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Model chunks per pipeline process (the interleaved schedule). A `ModelProvider`'s function
    is then called once per chunk with `vp_stage=i` as well; `prepare` returns the chunks as one
    `ModelChunks` model, trained through `accelerator.strategy.train_step`."""
    num_micro_batches: int = 1
    """Micro-batches per `train_step` under pipeline parallelism: each batch from the loader
    is split into this many along dim 0. More micro-batches, smaller bubble."""
    recompute_activations: bool = False
    """Selective activation recomputation (attention core recomputed in backward): less
    activation memory for a little extra compute. Applied to the TransformerConfig of models
    built through `transformer_config_kwargs`."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state (and the fp32 main parameters) over the data-parallel group
    (ZeRO-1): less memory per process; gradients are reduce-scattered and parameters
    all-gathered after the step."""
    gradient_accumulation_fusion: bool = False
    """Fuse weight-gradient accumulation into the GEMM (a CUDA kernel from apex/TE): faster
    on GPUs; refused on other devices."""
    gradient_clipping: float | None = None
    """Clip the global gradient norm (over all model-parallel shards) to this value inside
    megatron-core's optimizer step. None: no clipping."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduction with backward (bucketed, asynchronous)."""
    bucket_size: int | None = None
    """Elements per gradient-reduction bucket in megatron-core's DDP (None: its default)."""
    pipeline_dtype: str = "float32"
    """dtype of the activations sent between pipeline stages ("float32", "bfloat16", "float16");
    it must be the dtype the stages compute in."""
    seed: int = 1234
    """Seed set at prepare: the default generator gets it on every process (so parameters that
    every tensor-parallel rank replicates start equal), and megatron-core's model-parallel RNG
    tracker derives its streams from it (dropout inside tensor-parallel regions differs across
    TP ranks, outside them it is the same)."""

    def __post_init__(self) -> None:
        for name in ("tp_degree", "pp_degree", "cp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise MegatronConfigError(f"MegatronPlugin.{name} must be an integer >= 1, got {value!r}.")
        if self.sequence_parallelism and self.tp_degree == 1:
            raise MegatronConfigError(
                "sequence_parallelism=True splits activations over the tensor-parallel group and needs "
                "tp_degree > 1; set tp_degree or turn sequence_parallelism off."
            )
        virtual = self.num_layers_per_virtual_pipeline_stage or self.virtual_pipeline_model_parallel_size
        if virtual is not None and self.pp_degree == 1:
            raise MegatronConfigError(
                "A virtual (interleaved) pipeline needs pp_degree > 1; unset "
                "num_layers_per_virtual_pipeline_stage / virtual_pipeline_model_parallel_size or raise pp_degree."
            )
        if self.virtual_pipeline_model_parallel_size is not None and self.num_micro_batches % self.pp_degree:
            raise MegatronConfigError(
                f"The interleaved pipeline schedule needs num_micro_batches ({self.num_micro_batches}) to be a "
                f"multiple of pp_degree ({self.pp_degree})."
            )
        if self.pipeline_dtype not in ("float32", "bfloat16", "float16"):
            raise MegatronConfigError(
                f"pipeline_dtype must be 'float32', 'bfloat16' or 'float16', got {self.pipeline_dtype!r}."
            )
        if self.gradient_clipping is not None and self.gradient_clipping <= 0:
            raise MegatronConfigError(f"gradient_clipping must be > 0 or None, got {self.gradient_clipping}.")

    @property
    def torch_pipeline_dtype(self) -> Any:
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.pipeline_dtype]

    @property
    def model_parallel_size(self) -> int:
        """Processes that hold one copy of the model: tp x pp x cp."""
        return self.tp_degree * self.pp_degree * self.cp_degree

    def data_parallel_size(self, world_size: int) -> int:
        """Model replicas on `world_size` processes.

        Raises:
            MegatronConfigError: `world_size` is not a multiple of tp x pp x cp.
        """
        if world_size % self.model_parallel_size:
            raise MegatronConfigError(
                f"The world size ({world_size} processes) must be a multiple of tp_degree x pp_degree x cp_degree "
                f"= {self.tp_degree} x {self.pp_degree} x {self.cp_degree} = {self.model_parallel_size}. "
                "Launch a multiple of that many processes or lower the degrees."
            )
        return world_size // self.model_parallel_size

    def validate(self, world_size: int, device_type: str) -> None:
        """Check the plugin against the launched world and the device.

        Raises:
            MegatronConfigError: a world size that does not divide, or a CUDA-only feature
                on another device.
        """
        self.data_parallel_size(world_size)
        if self.gradient_accumulation_fusion and device_type != "cuda":
            raise MegatronConfigError(
                "gradient_accumulation_fusion needs the fused CUDA weight-gradient kernel (apex or Transformer "
                f"Engine) and this process runs on {device_type!r}; set gradient_accumulation_fusion=False."
            )
        if self.cp_degree > 1 and device_type != "cuda":
            raise MegatronConfigError(
                f"Context parallelism needs Transformer Engine's attention on CUDA; this process runs on "
                f"{device_type!r}. Use cp_degree=1."
            )

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """The parallelism fields of a megatron-core `TransformerConfig` for this plugin.

        `TransformerConfig(num_layers=..., hidden_size=..., **plugin.transformer_config_kwargs())`
        builds models whose layout matches what `prepare` sets up.
        """
        kwargs: dict[str, Any] = {
            "tensor_model_parallel_size": self.tp_degree,
            "pipeline_model_parallel_size": self.pp_degree,
            "context_parallel_size": self.cp_degree,
            "sequence_parallel": self.sequence_parallelism,
            "gradient_accumulation_fusion": self.gradient_accumulation_fusion,
        }
        if self.pp_degree > 1:
            kwargs["pipeline_dtype"] = self.torch_pipeline_dtype
        if self.virtual_pipeline_model_parallel_size is not None:
            kwargs["virtual_pipeline_model_parallel_size"] = self.virtual_pipeline_model_parallel_size
        if self.recompute_activations:
            kwargs["recompute_granularity"] = "selective"
        return kwargs
