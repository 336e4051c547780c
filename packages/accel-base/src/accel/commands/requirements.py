"""Packages accel-base does not depend on, and how the commands check for them (`accel env`, `accel launch`)."""

from __future__ import annotations

import importlib.util

# Strategies whose code needs a package accel-base does not depend on: (module, pip requirement).
STRATEGY_REQUIRES = {
    "deepspeed": ("deepspeed", "accel-base[deepspeed]"),
    # The strategy's entry point is accel-megatron's; megatron-core comes with its `megatron` extra.
    "megatron": ("megatron.core", "accel-megatron[megatron]"),
}


def installed(module: str) -> bool:
    """Whether `module` can be imported here, without importing it (a bare folder of that name in the
    working directory, a namespace package, does not count)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None
