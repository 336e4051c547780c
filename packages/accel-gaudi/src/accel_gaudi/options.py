"""The Gaudi adapter's options: one typed dataclass, filled once from code, flags or environment.

`accel launch --distribution-strategy fast_ddp --use-regional-compilation --force-autocast
--fp8` turns into the `ACCEL_GAUDI_*` variables below (`accel.adapter_options` generates the
flags and parses the variables); the adapter reads them in its `__init__` and nothing deeper
reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accel.adapter_options import AdapterOptions, option

DISTRIBUTION_STRATEGIES = ("ddp", "fast_ddp")


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
        help="gaudi: run the forward under bf16 autocast whatever --mixed-precision says",
    )
    """Run the model's forward under bf16 autocast even when `mixed_precision` is "no" or
    "fp8" (non-fp8 layers then compute in bf16); outputs come back as fp32."""
    fp8: bool = option(
        False, env="ACCEL_GAUDI_FP8", flag="--fp8", help="gaudi: convert Linear layers to Habana's fp8 Linear"
    )
    """Convert `nn.Linear` layers to Habana's fp8 Linear whatever `mixed_precision` says
    (usually combined with bf16 for the rest of the model)."""
