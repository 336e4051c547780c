"""`MegatronPlugin`: how megatron-core splits a model over processes, checked against the world."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
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
    activation memory for a little extra compute. Set on the TransformerConfig by
    `transformer_config_kwargs`; a prebuilt model without it is refused at prepare."""
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

    # ---- activation recomputation (megatron-core TransformerConfig fields) ----------------
    recompute_granularity: str | None = None
    """"full" (each recomputed layer re-runs entirely in backward) or "selective" (only the
    attention core). None: as `recompute_activations` says. Accelerate's plugin defaults to
    "full"; here recomputation is off unless asked for."""
    recompute_method: str | None = None
    """With "full": "uniform" (layers recomputed in groups of `recompute_num_layers`) or "block"
    (the first `recompute_num_layers` layers of each stage)."""
    recompute_num_layers: int | None = None
    """With "full": the group size ("uniform") or the count of recomputed layers ("block")."""

    # ---- model-shape fields (None: leave the model's TransformerConfig as built) ---------
    attention_dropout: float | None = None
    """Dropout on the attention probabilities."""
    hidden_dropout: float | None = None
    """Dropout on the attention and MLP outputs."""
    attention_softmax_in_fp32: bool | None = None
    """Compute the attention softmax in fp32 under bf16/fp16."""
    attention_backend: str | bool | None = None
    """megatron-core's `AttnBackend` by name ("local", "unfused", "fused", "flash", "auto"); off CUDA
    only "local" and "unfused" run. Accelerate's boolean: True is megatron-core's default, False "local"."""
    calculate_per_token_loss: bool | None = None
    """megatron-core's per-token loss normalisation; only False runs here (`loss_fn` returns a mean)."""
    use_rotary_position_embeddings: bool | None = None
    """Rotary instead of learned absolute position embeddings: a `GPTModel` argument
    (`position_embedding_type`), so it is checked against the prepared GPTModel and given by
    `plugin.gpt_model_kwargs()`."""
    eod_mask_loss: bool = False
    """Megatron-LM's GPT batch masks end-of-document tokens out of the loss; refused (True):
    accel has no Megatron `get_batch`, mask them in your `loss_fn`."""
    decoder_last_pipeline_num_layers: int | None = None
    """Layers on the last pipeline stage (the rest split evenly over the others): megatron-core's
    `num_layers_in_last_pipeline_stage`. Needs pp_degree > 1."""
    pipeline_model_parallel_split_rank: int | None = None
    """Encoder/decoder split rank of Megatron-LM's T5 pipeline; refused: megatron-core 0.16 has no
    encoder/decoder pipeline split."""
    other_megatron_args: dict[str, Any] | None = None
    """Further megatron-core `TransformerConfig` fields by name (e.g. `{"normalization": "RMSNorm"}`):
    added to `transformer_config_kwargs()` and checked on prebuilt models. A name that is no
    TransformerConfig field is refused (Megatron-LM's training-script arguments do not exist here)."""

    # ---- optimizer and checkpoint fields -----------------------------------------------
    optimizer_cpu_offload: bool = False
    """megatron-core's CPU-offloaded (hybrid device) distributed optimizer: CUDA only, needs
    `use_distributed_optimizer`."""
    use_precision_aware_optimizer: bool = False
    """megatron-core's precision-aware optimizer (Transformer Engine's FusedAdam): CUDA only."""
    overlap_cpu_optimizer_d2h_h2d: bool = False
    """With `optimizer_cpu_offload`: overlap the host/device copies with the step. CUDA only."""
    use_custom_fsdp: bool = False
    """Megatron's own FSDP; refused: megatron-core 0.16's Megatron-FSDP needs CUDA and its own
    training loop. Use `use_distributed_optimizer` (ZeRO-1) or accel's FSDP strategy."""
    no_save_optim: bool = False
    """`save_state` leaves the optimizer state out of megatron-core's checkpoint."""
    no_load_optim: bool = False
    """`load_state` restores models, scheduler and RNG but leaves the optimizer as it is."""
    is_train_batch_min: bool = True
    """Accelerate picks Megatron's one micro-batch size from the smaller (True) or larger (False)
    of the train and eval loaders' batch sizes. Here each loader keeps its own batch size, which is
    the smaller for training; False is refused."""

    # ---- optimizer parameter scheduler (MegatronLMDummyScheduler) -----------------------
    train_iters: int | None = None
    """Optimizer steps of the whole run (None: the dummy scheduler's `total_num_steps`)."""
    train_samples: int | None = None
    """Samples of the whole run (instead of `train_iters`): the schedule then counts samples and each step
    adds the global batch size (the prepared train loader's batch size x the data-parallel size)."""
    lr_decay_style: str = "linear"
    """"constant", "linear", "cosine", "inverse-square-root" or "WSD" (megatron-core's styles)."""
    lr_decay_iters: int | None = None
    """Steps the learning rate decays over (None: `train_iters`)."""
    lr_decay_samples: int | None = None
    """With `train_samples`: samples the learning rate decays over (None: `train_samples`)."""
    lr_warmup_iters: int | None = None
    """Steps of linear warmup from 0 (None: the dummy scheduler's `warmup_num_steps`)."""
    lr_warmup_samples: int | None = None
    """With `train_samples`: samples of linear warmup."""
    lr_warmup_fraction: float | None = None
    """Warmup as a fraction of the decay steps (instead of `lr_warmup_iters`)."""
    lr_wsd_decay_iters: int | None = None
    """"WSD": steps of the final decay."""
    lr_wsd_decay_style: str = "exponential"
    """"WSD": the final decay's shape ("exponential", "linear", "cosine")."""
    min_lr: float = 0.0
    """Learning rate floor of the decay."""
    weight_decay_incr_style: str = "constant"
    """Weight decay over the run: "constant", "linear" or "cosine" from `start_weight_decay` to
    `end_weight_decay` over `train_iters`."""
    start_weight_decay: float | None = None
    """Weight decay at step 0 (None: the optimizer's weight_decay)."""
    end_weight_decay: float | None = None
    """Weight decay at the last step (None: the optimizer's weight_decay)."""
    lr_mult: float = 1.0
    """Learning-rate multiplier for the parameters `scale_lr_cond` selects."""
    no_wd_decay_cond: Callable[[str, Any], bool] | None = None
    """`fn(name, param) -> bool`: parameters without weight decay (None: biases and 1-D
    parameters, megatron-core's default)."""
    scale_lr_cond: Callable[[str, Any], bool] | None = None
    """`fn(name, param) -> bool`: parameters whose learning rate is scaled by `lr_mult`."""

    # ---- data (MegatronLMDummyDataLoader) ---------------------------------------------
    megatron_dataset_flag: bool = False
    """Data comes from Megatron's datasets through `MegatronLMDummyDataLoader`s; a plain torch
    DataLoader prepared alongside is then refused."""
    custom_megatron_datasets_provider_function: Callable[[list[int]], Any] | None = None
    """`fn(train_val_test_num_samples) -> (train, valid, test)` datasets for the
    `MegatronLMDummyDataLoader`s (None: megatron-core's GPT datasets)."""
    consumed_samples: list[int] | None = None
    """Samples already consumed from the train, valid and test splits (a shorter list is padded with
    zeros): the `MegatronLMDummyDataLoader`s start after them, as Megatron-LM's sampler resumes."""
    seq_length: int | None = None
    """Tokens per sample: megatron-core's GPT datasets' length, and `train_step`'s default `seq_length`."""
    encoder_seq_length: int | None = None
    """T5's encoder length; refused: no encoder-decoder model here."""
    decoder_seq_length: int | None = None
    """T5's decoder length; refused: no encoder-decoder model here."""
    eval_iters: int = 100
    """Evaluation steps per evaluation: sizes the valid/test splits (Megatron-LM's formula)."""
    eval_interval: int = 1000
    """Steps between evaluations: sizes the valid split (Megatron-LM's formula)."""

    # ---- model and train-step hooks ----------------------------------------------------
    custom_model_provider_function: Callable[..., Any] | None = None
    """`fn(pre_process, post_process[, vp_stage])`: what `prepare` builds when it is given a model
    that is not megatron-core's (Accelerate: the Hugging Face model whose place it takes)."""
    custom_prepare_model_function: Callable[..., Any] | None = None
    """Refused: `ModelProvider` / `custom_model_provider_function` build the model; wrapping is prepare's."""
    custom_train_step_class: Any = None
    """Accelerate's train-step class, built as `cls(args, **custom_train_step_kwargs)`: its `forward_step(
    data_iterator, model) -> (output_tensor, loss_func)` is what `model(**batch)` runs through megatron-core's
    schedule (`accel_megatron.MegatronEngine`; base class `accel_megatron.AbstractTrainStep`)."""
    custom_train_step_kwargs: dict[str, Any] | None = None
    """Keyword arguments of `custom_train_step_class` (refused without it)."""
    custom_get_batch_function: Callable[..., Any] | None = None
    """`fn(data_iterator) -> (tokens, labels, loss_mask, attention_mask, position_ids)`: Accelerate's GPT step takes
    each micro-batch apart with it (`model(**batch)` of a `MegatronEngine`)."""
    custom_loss_function: Callable[..., Any] | None = None
    """`fn(loss_mask, output_tensor) -> (loss, {"lm loss": ...})`: Accelerate's GPT step's loss over the model's
    per-token losses (`model(**batch)` of a `MegatronEngine`)."""
    return_logits: bool = False
    """`train_step(..., forward_only=True)` returns `(loss, outputs)`: the last stage's outputs too."""
    context_parallel_size: int | None = None
    """Accelerate's name for `cp_degree` (the same field)."""
    expert_model_parallel_size: int = 1
    """MoE expert parallelism: experts split over this many processes of the data-parallel group."""
    expert_tensor_parallel_size: int | None = None
    """Tensor parallelism inside each expert (None: tp_degree)."""

    # ---- logging ----------------------------------------------------------------------
    tensorboard_dir: str | None = None
    """Write Megatron-LM's training scalars to TensorBoard here at every optimizer step (from the last
    process, as Megatron-LM does): "learning-rate", "batch-size", "lm loss", "loss-scale", "grad-norm",
    each also "... vs samples" (see `accel_megatron.tensorboard.TensorBoardLog`)."""
    set_all_logging_options: bool = False
    """Every Megatron-LM logging option, as Accelerate sets them: also "world-size", "num-zeros",
    "params-norm" (each with "vs samples"), "iteration-time" and, on CUDA, the memory scalars."""

    def __post_init__(self) -> None:
        self._coerce_settings()
        if self.context_parallel_size is not None:
            self.cp_degree = self.context_parallel_size
        for name in ("tp_degree", "pp_degree", "cp_degree", "num_micro_batches"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise MegatronConfigError(f"MegatronPlugin.{name} must be an integer >= 1, got {value!r}.")
        if self.sequence_parallelism and self.tp_degree == 1:
            raise MegatronConfigError(
                "sequence_parallelism=True splits activations over the tensor-parallel group and needs "
                "tp_degree > 1; set tp_degree or turn sequence_parallelism off."
            )
        self._derive_virtual_size()
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
        self._check_recompute()
        self._check_refused()
        self._check_schedule()

    def _derive_virtual_size(self) -> None:
        """Megatron-LM's chunk count from `num_layers_per_virtual_pipeline_stage` when the model's layer count
        is known (`other_megatron_args={"num_layers": N}`): N / pp_degree / layers per virtual stage."""
        per_stage = self.num_layers_per_virtual_pipeline_stage
        layers = (self.other_megatron_args or {}).get("num_layers")
        if not per_stage or layers is None or self.virtual_pipeline_model_parallel_size is not None:
            return
        if layers % (self.pp_degree * per_stage):
            raise MegatronConfigError(
                f"num_layers ({layers}) must be a multiple of pp_degree x num_layers_per_virtual_pipeline_stage "
                f"({self.pp_degree} x {per_stage})."
            )
        chunks = layers // (self.pp_degree * per_stage)
        self.virtual_pipeline_model_parallel_size = chunks if chunks > 1 else None

    def _coerce_settings(self) -> None:
        """Accelerate's `MEGATRON_LM_*` settings arrive as strings: give them the field's type."""
        backend = self.attention_backend
        if isinstance(backend, bool) or str(backend).lower() in ("true", "false"):
            # Accelerate's field is a boolean "enable attention backend" (default True): megatron-core's own
            # choice (auto); off: its local (unfused) attention.
            self.attention_backend = None if str(backend).lower() == "true" else "local"
        if self.attention_backend is not None:
            names = ("local", "unfused", "fused", "flash", "auto")
            if self.attention_backend not in names:
                raise MegatronConfigError(
                    f"attention_backend must be one of {names} (or a boolean), got {self.attention_backend!r}."
                )
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or f.name == "attention_backend":
                continue
            kind = str(f.type)
            try:
                if "bool" in kind:
                    setattr(self, f.name, value.strip().lower() in ("1", "true", "yes", "on"))
                elif kind.startswith("int"):
                    setattr(self, f.name, int(value))
                elif kind.startswith("float"):
                    setattr(self, f.name, float(value))
            except ValueError:
                raise MegatronConfigError(f"MegatronPlugin.{f.name} must be a {kind}, got {value!r}.") from None

    def _check_recompute(self) -> None:
        if self.recompute_granularity not in (None, "full", "selective"):
            raise MegatronConfigError(
                f"recompute_granularity must be 'full', 'selective' or None, got {self.recompute_granularity!r}."
            )
        if self.recompute_method not in (None, "uniform", "block"):
            raise MegatronConfigError(f"recompute_method must be 'uniform' or 'block', got {self.recompute_method!r}.")
        if self.granularity == "full" and (self.recompute_method is None or self.recompute_num_layers is None):
            raise MegatronConfigError(
                "recompute_granularity='full' needs recompute_method ('uniform' or 'block') and recompute_num_layers."
            )
        if self.granularity != "full" and (self.recompute_method or self.recompute_num_layers):
            raise MegatronConfigError(
                "recompute_method and recompute_num_layers apply to recompute_granularity='full' only; set it or "
                "unset them."
            )

    def _check_refused(self) -> None:
        """Accelerate's fields that have no megatron-core counterpart here: refused by name, with the reason."""
        refused = {
            "pipeline_model_parallel_split_rank": (
                self.pipeline_model_parallel_split_rank is not None,
                "megatron-core 0.16 has no encoder/decoder pipeline split (Megatron-LM's T5 pipeline); unset it",
            ),
            "use_custom_fsdp": (
                self.use_custom_fsdp,
                "Megatron-FSDP needs CUDA and megatron-core's own training loop; use use_distributed_optimizer=True "
                "(ZeRO-1) or accel's FSDP strategy",
            ),
            "eod_mask_loss": (
                self.eod_mask_loss and not self.megatron_dataset_flag,
                "only Megatron's GPT datasets (megatron_dataset_flag=True, MegatronLMDummyDataLoader) build the loss "
                "mask; with your own data mask end-of-document tokens in your loss_fn",
            ),
            "calculate_per_token_loss": (
                bool(self.calculate_per_token_loss),
                "train_step's loss_fn returns a mean loss, not megatron-core's (loss sum, token count) pair",
            ),
            "is_train_batch_min": (
                not self.is_train_batch_min,
                "each prepared loader keeps its own batch size (Megatron-LM's single micro-batch size does not "
                "exist here); leave it True",
            ),
        }
        refused |= {
            "custom_prepare_model_function": (
                self.custom_prepare_model_function is not None,
                "prepare builds and wraps the model; give custom_model_provider_function or a ModelProvider",
            ),
            "custom_train_step_kwargs": (
                bool(self.custom_train_step_kwargs) and self.custom_train_step_class is None,
                "they are the keyword arguments of custom_train_step_class, which is not set",
            ),
            "encoder_seq_length": (self.encoder_seq_length is not None, "no encoder-decoder (T5) model here"),
            "decoder_seq_length": (self.decoder_seq_length is not None, "no encoder-decoder (T5) model here"),
        }
        for name in ("lr_decay_samples", "lr_warmup_samples"):
            refused[name] = (
                getattr(self, name) is not None and self.train_samples is None,
                "sample counts need train_samples (or give lr_decay_iters / lr_warmup_iters)",
            )
        refused["train_samples"] = (
            self.train_samples is not None and self.train_iters is not None,
            "give train_iters or train_samples, not both",
        )
        for name, (bad, reason) in refused.items():
            if bad:
                raise MegatronConfigError(f"MegatronPlugin.{name} is not supported: {reason}.")
        if self.decoder_last_pipeline_num_layers is not None and self.pp_degree == 1:
            raise MegatronConfigError("decoder_last_pipeline_num_layers needs pp_degree > 1.")
        if self.optimizer_cpu_offload and not self.use_distributed_optimizer:
            raise MegatronConfigError("optimizer_cpu_offload needs use_distributed_optimizer=True.")

    def _check_schedule(self) -> None:
        styles = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
        if self.lr_decay_style not in styles:
            raise MegatronConfigError(f"lr_decay_style must be one of {styles}, got {self.lr_decay_style!r}.")
        if self.weight_decay_incr_style not in ("constant", "linear", "cosine"):
            raise MegatronConfigError(
                "weight_decay_incr_style must be 'constant', 'linear' or 'cosine', got "
                f"{self.weight_decay_incr_style!r}."
            )
        given = (self.start_weight_decay, self.end_weight_decay)
        if self.weight_decay_incr_style == "constant" and given != (None, None):
            raise MegatronConfigError(
                "start_weight_decay/end_weight_decay need weight_decay_incr_style 'linear' or 'cosine' (constant "
                "uses the optimizer's weight_decay)."
            )
        if self.weight_decay_incr_style != "constant" and None in given:
            raise MegatronConfigError(
                f"weight_decay_incr_style={self.weight_decay_incr_style!r} needs start_weight_decay and end_weight_decay."
            )
        if self.lr_decay_style == "WSD" and self.lr_wsd_decay_iters is None:
            raise MegatronConfigError("lr_decay_style='WSD' needs lr_wsd_decay_iters.")
        if self.lr_warmup_fraction is not None and self.lr_warmup_iters is not None:
            raise MegatronConfigError("Set lr_warmup_fraction or lr_warmup_iters, not both.")
        if self.min_lr < 0 or self.lr_mult <= 0:
            raise MegatronConfigError(f"min_lr must be >= 0 and lr_mult > 0, got {self.min_lr} and {self.lr_mult}.")

    def schedule_fields_set(self) -> list[str]:
        """The schedule fields (those of a `MegatronLMDummyScheduler`) given other values than their defaults."""
        defaults = {
            "train_iters": None,
            "train_samples": None,
            "lr_decay_style": "linear",
            "lr_decay_iters": None,
            "lr_warmup_iters": None,
            "lr_warmup_fraction": None,
            "lr_wsd_decay_iters": None,
            "min_lr": 0.0,
            "weight_decay_incr_style": "constant",
        }
        return [name for name, default in defaults.items() if getattr(self, name) != default]

    @property
    def granularity(self) -> str | None:
        """The recompute granularity in effect: `recompute_granularity`, else "selective" under
        `recompute_activations`."""
        if self.recompute_granularity is not None:
            return self.recompute_granularity
        return "selective" if self.recompute_activations else None

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
        if device_type != "cuda":
            for name in ("optimizer_cpu_offload", "use_precision_aware_optimizer", "overlap_cpu_optimizer_d2h_h2d"):
                if getattr(self, name):
                    raise MegatronConfigError(
                        f"{name} needs megatron-core's CUDA optimizer kernels (Transformer Engine / the hybrid "
                        f"device optimizer) and this process runs on {device_type!r}; set {name}=False."
                    )
            if self.attention_backend not in (None, "local", "unfused"):
                raise MegatronConfigError(
                    f"attention_backend={self.attention_backend!r} needs Transformer Engine on CUDA and this "
                    f"process runs on {device_type!r}; use 'local' or 'unfused'."
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
        kwargs.update(self.model_fields())
        return kwargs

    def model_fields(self) -> dict[str, Any]:
        """The TransformerConfig fields beyond the parallel layout that the plugin sets (recomputation,
        dropouts, attention options, the last stage's layer count, `other_megatron_args`); prepare checks a
        prebuilt model against them.

        Raises:
            MegatronConfigError: an `other_megatron_args` name that is no TransformerConfig field.
        """
        out: dict[str, Any] = {}
        if self.granularity is not None:
            out["recompute_granularity"] = self.granularity
        if self.granularity == "full":
            out["recompute_method"] = self.recompute_method
            out["recompute_num_layers"] = self.recompute_num_layers
        for name in ("attention_dropout", "hidden_dropout", "attention_softmax_in_fp32", "calculate_per_token_loss"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.attention_backend is not None:
            from megatron.core.transformer.enums import AttnBackend

            out["attention_backend"] = AttnBackend[self.attention_backend]
        if self.decoder_last_pipeline_num_layers is not None:
            out["num_layers_in_last_pipeline_stage"] = self.decoder_last_pipeline_num_layers
        if self.expert_model_parallel_size > 1:
            out["expert_model_parallel_size"] = self.expert_model_parallel_size
        if self.expert_tensor_parallel_size is not None:
            out["expert_tensor_parallel_size"] = self.expert_tensor_parallel_size
        if self.other_megatron_args:
            from megatron.core.transformer.transformer_config import TransformerConfig

            known = {f.name for f in fields(TransformerConfig)}
            unknown = sorted(set(self.other_megatron_args) - known)
            if unknown:
                raise MegatronConfigError(
                    f"other_megatron_args {unknown} are not megatron-core TransformerConfig fields; Megatron-LM's "
                    "training-script arguments do not exist here (set the matching MegatronPlugin field, or the "
                    "model's own arguments)."
                )
            out.update(self.other_megatron_args)
        return out

    def gpt_model_kwargs(self) -> dict[str, Any]:
        """`GPTModel` keyword arguments the plugin decides (`position_embedding_type` from
        `use_rotary_position_embeddings`)."""
        if self.use_rotary_position_embeddings is None:
            return {}
        return {"position_embedding_type": "rope" if self.use_rotary_position_embeddings else "learned_absolute"}
