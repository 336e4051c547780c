"""Tensor parallelism from a plan (torch's `parallelize_module`), the transformers convention.

A plan maps module-name patterns (`"layers.*.mlp.up_proj"`, `*` matching one name) to a
style: "colwise" (weight split by output features, output left sharded), "rowwise" (weight
split by input features, output summed over the `tp` ranks), "colwise_rep" / "rowwise_rep"
(their replicated-output/input variants), "sequence_parallel", or any torch
`ParallelStyle`. The plan is the one given in `ParallelismConfig(tp_plan=...)`, else the
model's `tp_plan` attribute, else `model.config.base_model_tp_plan`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "rowwise_rep", "sequence_parallel")


def model_tp_plan(model: nn.Module) -> dict[str, Any] | None:
    """The model's own plan (transformers: `model.tp_plan` / `_tp_plan`, else `config.base_model_tp_plan`)."""
    for name in ("tp_plan", "_tp_plan"):
        plan = getattr(model, name, None)
        if plan:
            return dict(plan)
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if plan:
        prefix = getattr(model, "base_model_prefix", "")
        inner = getattr(model, prefix, None) if prefix else None
        # The base model's plan names modules under the base model (e.g. `model.layers.*`).
        return {f"{prefix}.{k}" if inner is not None else k: v for k, v in plan.items()}
    return None


def parallel_style(style: Any) -> Any:
    """The torch `ParallelStyle` for a plan entry (a name of STYLE_NAMES or a style object)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if isinstance(style, ParallelStyle):
        return style
    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": lambda: SequenceParallel(),
    }
    if not isinstance(style, str) or style not in styles:
        raise ValueError(
            f"Unknown tensor-parallel style {style!r}; use one of {STYLE_NAMES} or a torch ParallelStyle "
            "(torch.distributed.tensor.parallel)."
        )
    return styles[style]()


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: dict[str, Any] | None) -> None:
    """Split `model`'s layers over `tp_mesh` in place following `plan` (else the model's own plan).

    Raises:
        ValueError: no plan anywhere, an unknown style, or a pattern that matches no module.
    """
    import fnmatch

    from torch.distributed.tensor.parallel import parallelize_module

    plan = dict(plan) if plan else model_tp_plan(model)
    if not plan:
        raise ValueError(
            "tp_size > 1 needs a tensor-parallel plan: give the model a `tp_plan` dict (module-name pattern -> "
            "'colwise'/'rowwise'/...), as transformers models carry, or pass ParallelismConfig(tp_plan=...)."
        )
    names = [n for n, _ in model.named_modules() if n]
    missing = [p for p in plan if not any(fnmatch.fnmatchcase(n, p) and n.count(".") == p.count(".") for n in names)]
    if missing:
        raise ValueError(f"The tensor-parallel plan names modules the model does not have: {missing}.")
    parallelize_module(model, tp_mesh, {pattern: parallel_style(style) for pattern, style in plan.items()})
