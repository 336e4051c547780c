"""The Gaudi adapter's options: one typed dataclass, filled once from flags or environment.

`accel launch --distribution-strategy fast_ddp --use-regional-compilation --force-autocast
--fp8` turns into the `ACCEL_GAUDI_*` variables below; the adapter parses them in its
`__init__` and nothing deeper reads the environment.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

DISTRIBUTION_STRATEGIES = ("ddp", "fast_ddp")

ENV = {
    "distribution_strategy": "ACCEL_GAUDI_DISTRIBUTION_STRATEGY",
    "use_regional_compilation": "ACCEL_GAUDI_USE_REGIONAL_COMPILATION",
    "force_autocast": "ACCEL_GAUDI_FORCE_AUTOCAST",
    "fp8": "ACCEL_GAUDI_FP8",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(kw_only=True, frozen=True)
class GaudiOptions:
    """How the Gaudi adapter prepares models. Each field has a launch flag and a variable in `ENV`."""

    distribution_strategy: str = "ddp"
    """Data parallelism under the "ddp" strategy. "ddp": DistributedDataParallel (overlaps the
    all-reduce with backward, bucket by bucket). "fast_ddp": no wrapper; one all-reduce of all
    gradients from a flat buffer per optimizer step (bf16 on HPU), parameters broadcast from
    rank 0 at prepare. Fewer, larger collectives and no DDP bookkeeping, but no overlap."""
    use_regional_compilation: bool = False
    """Compile each block of every `nn.ModuleList` instead of the whole model (implies
    compilation, with the adapter's backend if none was chosen): identical blocks share one
    compilation, so deep models compile in a fraction of the time."""
    force_autocast: bool = False
    """Run the model's forward under bf16 autocast even when `mixed_precision` is "no" or
    "fp8" (non-fp8 layers then compute in bf16); outputs come back as fp32."""
    fp8: bool = False
    """Convert `nn.Linear` layers to Habana's fp8 Linear whatever `mixed_precision` says
    (usually combined with bf16 for the rest of the model)."""

    def __post_init__(self) -> None:
        if self.distribution_strategy not in DISTRIBUTION_STRATEGIES:
            raise ValueError(
                f"distribution_strategy must be one of {DISTRIBUTION_STRATEGIES}, got "
                f"{self.distribution_strategy!r} (from --distribution-strategy or {ENV['distribution_strategy']})."
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> GaudiOptions:
        """Parse the `ACCEL_GAUDI_*` variables; `overrides` (field name -> value) win.

        Raises:
            ValueError: a flag variable that is not a boolean word, an unknown strategy,
                or an override naming no field.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, var in ENV.items():
            raw = env.get(var)
            if raw is None:
                continue
            values[name] = raw.strip().lower() if name == "distribution_strategy" else _flag(var, raw)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides or {}) - known)
        if unknown:
            raise ValueError(f"Unknown Gaudi adapter option(s) {unknown}; the options are {sorted(known)}.")
        values.update(overrides or {})
        return cls(**values)


def _flag(var: str, raw: str) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{var}={raw!r} is not a boolean; set it to 1 or 0.")


def add_launch_arguments(group: argparse._ArgumentGroup) -> None:
    """The Gaudi flags of `accel launch`."""
    group.add_argument(
        "--distribution-strategy",
        dest="distribution_strategy",
        choices=DISTRIBUTION_STRATEGIES,
        default=None,
        help="gaudi: 'ddp' (DistributedDataParallel, default) or 'fast_ddp' (one flat all-reduce per step)",
    )
    group.add_argument(
        "--use-regional-compilation",
        dest="use_regional_compilation",
        action="store_true",
        help="gaudi: torch.compile each repeated block (ModuleList children) once instead of the whole model",
    )
    group.add_argument(
        "--force-autocast",
        dest="force_autocast",
        action="store_true",
        help="gaudi: run the forward under bf16 autocast whatever --mixed-precision says",
    )
    group.add_argument(
        "--fp8", dest="fp8", action="store_true", help="gaudi: convert Linear layers to Habana's fp8 Linear"
    )


def launch_env(args: argparse.Namespace) -> dict[str, str]:
    """The variables the workers read back into `GaudiOptions` (only the flags that were given)."""
    env: dict[str, str] = {}
    strategy = getattr(args, "distribution_strategy", None)
    if strategy is not None:
        env[ENV["distribution_strategy"]] = strategy
    for name in ("use_regional_compilation", "force_autocast", "fp8"):
        if getattr(args, name, False):
            env[ENV[name]] = "1"
    return env
