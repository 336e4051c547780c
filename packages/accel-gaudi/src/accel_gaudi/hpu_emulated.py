"""The CPU stand-in for `accel_gaudi.hpu`: same functions, no Habana software.

Calls that only matter on the device (step markers, backend registration, seeding) are
counted in `calls`, so tests can assert where the adapter makes them. The fp8 pieces
stand for Habana's transformer engine with the core's `accel.fp8_emulation`: a Linear that
really quantises its input, weight and output gradient to `torch.float8_e4m3fn` /
`torch.float8_e5m2` with per-tensor delayed scaling, so numerics differ from fp32 the way
fp8 training does.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from accel import fp8_emulation as f8
from torch import nn

COMPILE_BACKEND = "inductor"
"""hpu_backend exists only with the Habana bridge; inductor is torch's own CPU compiler."""

ALLREDUCE_DTYPE = torch.float32
"""fp32, not the hardware's bf16: under emulation fast_ddp must match DDP's fp32 reduction
on gloo to within float rounding, so tests can tell a wrong reduction from bf16 noise."""

calls: Counter[str] = Counter()
"""How many times each device-only call was made (reset it between tests)."""


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def init_distributed() -> None:
    calls["init_distributed"] += 1


def is_lazy() -> bool:
    """Lazy mode as Habana's bridge reads it: `PT_HPU_LAZY_MODE`, on unless set to 0."""
    return os.environ.get("PT_HPU_LAZY_MODE", "1") != "0"


def mark_step() -> None:
    calls["mark_step"] += 1


def get_rng_state() -> None:
    # The emulated device draws from the host generator, which accel already saves.
    return None


def set_rng_state(state: Any) -> None:
    return None


def manual_seed(seed: int) -> None:
    calls["manual_seed"] += 1


# ---- fp8: stands for habana_frameworks.torch.hpex.experimental.transformer_engine ----------


@dataclass(kw_only=True, frozen=True)
class DelayedScaling(f8.Float8Recipe):
    """Stands for `transformer_engine.recipe.DelayedScaling`: the core's emulated recipe, delayed."""

    scaling: str = "delayed"
    reduce_amax: bool = True
    """Recorded as the vendor recipe has it; emulated ranks scale by their own amax."""


def make_fp8_recipe(**kwargs: Any) -> DelayedScaling:
    return DelayedScaling(**kwargs)


fp8_autocast = f8.fp8_autocast
"""Inside, fp8 Linears quantise with the recipe; outside they compute in full precision."""


class Linear(f8.Float8Linear):
    """Stands for transformer engine's `Linear`: fp8 compute inside `fp8_autocast`, plain outside,
    holding the converted layer's Parameters."""


def fp8_linear(linear: nn.Linear) -> nn.Module:
    return Linear(linear)


def is_fp8_linear(module: nn.Module) -> bool:
    return isinstance(module, Linear)
