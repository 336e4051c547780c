"""The Gaudi adapter's options: one typed dataclass, filled once from code, flags or environment.

`accel launch --distribution-strategy fast_ddp --use-regional-compilation --force-autocast
--fp8` turns into the `ACCEL_GAUDI_*` variables below (`accel.adapter.options` generates the
flags and parses the variables); the adapter reads them in its `__init__` and nothing deeper
reads the environment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from accel.adapter.options import AdapterOptions, AdapterOptionsError, option

DISTRIBUTION_STRATEGIES = ("ddp", "fast_ddp")
AUTOCAST_POLICIES = ("native_amp", "always")


@dataclass(kw_only=True, frozen=True)
class GaudiOptions(AdapterOptions):
    """How the Gaudi adapter prepares models. Each field has a launch flag and an `ACCEL_GAUDI_*` variable."""

    label: ClassVar[str] = "Gaudi"

    distribution_strategy: str = option(
        "ddp",
        env="ACCEL_GAUDI_DISTRIBUTION_STRATEGY",
        flag="--distribution-strategy",
        choices=DISTRIBUTION_STRATEGIES,
        help="gaudi: 'ddp' (DistributedDataParallel, default) or 'fast_ddp' (one flat all-reduce per step)",
    )
    """Data parallelism under the "ddp" strategy. "ddp": DistributedDataParallel (overlaps the
    all-reduce with backward, bucket by bucket). "fast_ddp": no wrapper; one all-reduce of all
    gradients from a flat buffer per optimizer step (bf16 on HPU), parameters broadcast from
    rank 0 at prepare. Fewer, larger collectives and no DDP bookkeeping, but no overlap."""
    use_regional_compilation: bool = option(
        False,
        env="ACCEL_GAUDI_USE_REGIONAL_COMPILATION",
        flag="--use-regional-compilation",
        help="gaudi: torch.compile each repeated block (ModuleList children) once instead of the whole model",
    )
    """Compile each block of every `nn.ModuleList` instead of the whole model (implies
    compilation, with the adapter's backend if none was chosen): identical blocks share one
    compilation, so deep models compile in a fraction of the time."""
    force_autocast: bool = option(
        False,
        env="ACCEL_GAUDI_FORCE_AUTOCAST",
        flag="--force-autocast",
        help="gaudi: run the forward under bf16 autocast when --mixed-precision is bf16 (Gaudi's rule; "
        "with --autocast-policy always, whatever --mixed-precision says)",
    )
    """Wrap the model's forward in bf16 autocast. Under the default `autocast_policy`
    ("native_amp", Gaudi's own rule) only with `mixed_precision="bf16"`: without this flag a
    bf16 run leaves the forward unwrapped (Gaudi's Trainer autocasts around it). Under
    `autocast_policy="always"` it also wraps the forward when `mixed_precision` is "no" or
    "fp8"; outputs come back as fp32."""
    autocast_policy: str = option(
        "native_amp",
        env="ACCEL_GAUDI_AUTOCAST_POLICY",
        flag="--autocast-policy",
        choices=AUTOCAST_POLICIES,
        help="gaudi: 'native_amp' (autocast only bf16 runs with --force-autocast, as Gaudi's Accelerator) or "
        "'always' (every bf16 run, and --force-autocast whatever --mixed-precision says)",
    )
    """When the forward runs under bf16 autocast. "native_amp" (default, as optimum-habana's
    `GaudiAccelerator`: `native_amp and force_autocast`): only `mixed_precision="bf16"` with
    `force_autocast`. "always" (portable scripts, the same as on other accelerators):
    `mixed_precision="bf16"` always, and `force_autocast` under any `mixed_precision`."""
    fp8: bool = option(
        False, env="ACCEL_GAUDI_FP8", flag="--fp8", help="gaudi: convert Linear layers to Habana's fp8 Linear"
    )
    """Convert `nn.Linear` layers to Habana's fp8 Linear whatever `mixed_precision` says
    (usually combined with bf16 for the rest of the model)."""
    fused_optimizers: bool = option(
        True,
        env="ACCEL_GAUDI_FUSED_OPTIMIZERS",
        flag="--fused-optimizers",
        help="gaudi: replace torch AdamW with Habana's FusedAdamW and clip with FusedClipNorm where present",
    )
    """Use Habana's `FusedAdamW` for a plain `torch.optim.AdamW` and `FusedClipNorm` for
    `clip_grad_norm_` (2-norm) when the stack has them (as Gaudi's Trainer does); off keeps torch's."""
    compiled_autograd_enabled: bool = option(
        False,
        env="ACCEL_GAUDI_COMPILED_AUTOGRAD_ENABLED",
        flag="--compiled-autograd-enabled",
        help="gaudi: under DeepSpeed with a dynamo backend, compile the engine's backward too (compiled autograd)",
    )
    """Under DeepSpeed with compilation on (a dynamo backend, not regional), `engine.compile` also turns
    on compiled autograd, so the backward is captured and compiled as one graph, as optimum-habana's
    `GaudiAccelerator(compiled_autograd_enabled=True)` (`use_compiled_autograd`) does. Costs a longer
    first backward; no effect under other strategies or without compilation (as there)."""
    cache_size_limit: int | None = option(
        None,
        env="ACCEL_GAUDI_CACHE_SIZE_LIMIT",
        flag="--cache-size-limit",
        minimum=1,
        help="gaudi: torch._dynamo.config.cache_size_limit when compiling (optimum-habana's cache_size_limit)",
    )
    """When compiling, how many graphs dynamo keeps per function before it falls back to eager
    (`torch._dynamo.config.cache_size_limit`, as optimum-habana's training argument sets it); None leaves torch's."""
    inline_inbuilt_nn_modules: bool | None = option(
        None,
        env="ACCEL_GAUDI_INLINE_INBUILT_NN_MODULES",
        flag="--inline-inbuilt-nn-modules",
        none_word="default",
        help="gaudi: torch._dynamo.config.inline_inbuilt_nn_modules when compiling (optimum-habana's knob)",
    )
    """When compiling, whether dynamo traces into torch's own `nn` modules
    (`torch._dynamo.config.inline_inbuilt_nn_modules`); None leaves torch's. A torch that always inlines them
    (the setting is deprecated there) takes True and refuses False by name."""
    allow_unspec_int_on_nn_module: bool | None = option(
        None,
        env="ACCEL_GAUDI_ALLOW_UNSPEC_INT_ON_NN_MODULE",
        flag="--allow-unspec-int-on-nn-module",
        none_word="default",
        help="gaudi: torch._dynamo.config.allow_unspec_int_on_nn_module when compiling (optimum-habana's knob)",
    )
    """When compiling, whether integer attributes of modules stay dynamic instead of being specialised
    (`torch._dynamo.config.allow_unspec_int_on_nn_module`; matters with `dynamic=None` or True); None leaves torch's."""
    use_hpu_graphs_for_training: bool = option(
        False,
        env="ACCEL_GAUDI_USE_HPU_GRAPHS_FOR_TRAINING",
        flag="--use-hpu-graphs-for-training",
        help="gaudi: record the model's training forward and backward as HPU graphs (Habana's ModuleCacher)",
    )
    """Wrap the model in Habana's `ModuleCacher` at `prepare` (training only, before the strategy), as
    optimum-habana's `use_hpu_graphs_for_training`: each forward/backward is recorded once as an HPU graph and
    replayed, cutting host overhead for models with static shapes."""
    context_parallel_size: int = option(
        1,
        env="ACCEL_GAUDI_CONTEXT_PARALLEL_SIZE",
        flag="--context-parallel-size",
        minimum=1,
        help="gaudi: processes one sequence is split over (optimum-habana's context_parallel_size); "
        "accelerator.mpu gives the groups",
    )
    """optimum-habana's `context_parallel_size`: consecutive ranks form sequence-parallel groups of this size
    (the chunks of one sequence, for model code that splits attention over `accelerator.mpu`'s sequence-parallel
    group, as optimum-habana's models do), and prepared loaders, `gather_for_metrics` and `reduce` run over the
    data-parallel groups only, so every process of a sequence-parallel group sees the same batches. Gradients
    are still averaged over every process (the sequence-parallel peers ride on data parallelism, as there).
    With the ddp and fast_ddp strategies."""
    use_torch_autocast: bool = option(
        False,
        env="ACCEL_GAUDI_USE_TORCH_AUTOCAST",
        flag="--use-torch-autocast",
        help="gaudi: run the forward under bf16 autocast whatever --mixed-precision says (optimum-habana's "
        "gaudi_config.use_torch_autocast); not under DeepSpeed",
    )
    """Wrap the model's forward in bf16 autocast under any `mixed_precision`, as optimum-habana's Trainer turns
    on its HPU autocast for a Gaudi config with `use_torch_autocast`; outputs come back as fp32. Not under
    DeepSpeed, which manages precision itself (optimum-habana turns the setting off there too)."""
    autocast_bf16_ops: str | None = option(
        None,
        env="ACCEL_GAUDI_AUTOCAST_BF16_OPS",
        flag="--autocast-bf16-ops",
        help="gaudi: comma-separated ops Habana's autocast runs in bf16 (optimum-habana's autocast_bf16_ops; "
        "with --autocast-fp32-ops)",
    )
    """The ops Habana's autocast runs in bf16 (names as optimum-habana's `autocast_bf16_ops`: "linear",
    "matmul", "softmax", ...), comma-separated (a list in code). Given with `autocast_fp32_ops`, the two replace
    Habana's default lists: they are written to files named by `PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST` /
    `PT_HPU_AUTOCAST_FP32_OPS_LIST`, which the bridge reads once; ops on neither list run in their inputs' dtype."""
    autocast_fp32_ops: str | None = option(
        None,
        env="ACCEL_GAUDI_AUTOCAST_FP32_OPS",
        flag="--autocast-fp32-ops",
        help="gaudi: comma-separated ops Habana's autocast runs in fp32 (optimum-habana's autocast_fp32_ops; "
        "with --autocast-bf16-ops)",
    )
    """The ops Habana's autocast runs in fp32 ("embedding", "nll_loss", "log_softmax", ...), with
    `autocast_bf16_ops` (see there)."""

    def __post_init__(self) -> None:
        for name in ("autocast_bf16_ops", "autocast_fp32_ops"):
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, ",".join(str(op) for op in value))
        super().__post_init__()
        lists = (self.autocast_bf16_ops, self.autocast_fp32_ops)
        if (lists[0] is None) != (lists[1] is None):
            raise AdapterOptionsError(
                "autocast_bf16_ops and autocast_fp32_ops replace Habana's two autocast lists together: give both "
                "(--autocast-bf16-ops and --autocast-fp32-ops, or ACCEL_GAUDI_AUTOCAST_BF16_OPS and "
                "ACCEL_GAUDI_AUTOCAST_FP32_OPS), or neither."
            )
        for name in ("autocast_bf16_ops", "autocast_fp32_ops"):
            value = getattr(self, name)
            bad = [op for op in split_ops(value or "") if not _OP_NAME.fullmatch(op)]
            if bad:
                raise AdapterOptionsError(f"{name}: {bad} are not op names (letters, digits and '_', comma-separated).")

    @property
    def autocast_op_lists(self) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(bf16 ops, fp32 ops) when both lists are given, else None."""
        if self.autocast_bf16_ops is None or self.autocast_fp32_ops is None:
            return None
        return split_ops(self.autocast_bf16_ops), split_ops(self.autocast_fp32_ops)


_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def split_ops(value: str) -> tuple[str, ...]:
    """The op names of a comma-separated list, blanks dropped."""
    return tuple(op.strip() for op in value.split(",") if op.strip())
