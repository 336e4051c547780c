"""The Gaudi adapter's options: one typed dataclass, filled once from code, flags or environment.

`accel launch --distribution-strategy fast_ddp --use-regional-compilation --force-autocast
--fp8` turns into the `ACCEL_GAUDI_*` variables below (`accel.adapter.options` generates the
flags and parses the variables); the adapter reads them in its `__init__` and nothing deeper
reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accel.adapter.options import AdapterOptions, option

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
