"""Tensor parallelism from a plan (torch's `parallelize_module`), the transformers convention.

A plan maps module-name patterns (`"layers.*.mlp.up_proj"`, `*` matching one name) to a
style name or any torch `ParallelStyle`. The plan is the one given in
`ParallelismConfig(tp_plan=...)`, else the model's `tp_plan` attribute, else
`model.config.base_model_tp_plan`. transformers' style names (4.x and 5.x) map to the torch
`ParallelStyle` with the same layouts (`STYLES`); `replicate` leaves the module alone (every
rank keeps the full weights); the styles whose semantics torch has no native style for (fused
or packed weights, expert parallelism, per-head norms with partial gradients) are refused by
name (`REFUSED_STYLES`) with the supported list.

A model already split by transformers (`from_pretrained(..., tp_plan="auto",
device_mesh=accelerator.torch_device_mesh)`) or by hand (`parallelize_module`) has DTensor
weights: it is left as it is, after checking that its tensor-parallel size is the config's.
"""

from __future__ import annotations

from typing import Any

from torch import nn

# name -> (torch style class name, keyword arguments as placements), the transformers meaning of each:
# colwise: weight split by output features, input replicated, output left sharded (local);
# rowwise: weight split by input features, input sharded, output summed (replicated);
# the *_rep / gather / split_input forms: the replicated output or input;
# embedding_rowwise: vocabulary split (each rank's partial lookups summed); embedding_colwise: hidden split.
_STYLES: dict[str, tuple[str, dict[str, str]]] = {
    "colwise": ("ColwiseParallel", {}),
    "local_colwise": ("ColwiseParallel", {}),
    "colwise_rep": ("ColwiseParallel", {"output_layouts": "replicate"}),
    "colwise_gather_output": ("ColwiseParallel", {"output_layouts": "replicate"}),
    "rowwise": ("RowwiseParallel", {}),
    "rowwise_rep": ("RowwiseParallel", {"input_layouts": "replicate"}),
    "rowwise_split_input": ("RowwiseParallel", {"input_layouts": "replicate"}),
    "embedding_rowwise": ("RowwiseParallel", {"input_layouts": "replicate"}),
    "embedding_colwise": ("ColwiseParallel", {"output_layouts": "replicate"}),
    "sequence_parallel": ("SequenceParallel", {}),
}
REPLICATED_STYLES = ("replicate",)
"""Styles that keep the full weights on every rank: the entry is skipped."""
STYLE_NAMES = (*_STYLES, *REPLICATED_STYLES)
"""Every style name accel applies."""
REFUSED_STYLES = {
    "packed_colwise": "fused weights packed along the output dimension (e.g. gate_up_proj)",
    "packed_rowwise": "fused weights packed along the input dimension",
    "local_packed_rowwise": "fused weights packed along the input dimension",
    "replicated_with_grad_allreduce": "replicated weights whose gradients are partial (e.g. Qwen3's q_norm/k_norm)",
    "mla_kv_a_proj": "DeepSeek-style MLA projections",
    "all_reduce": "a module whose output is partial",
    "gather": "a module whose output is partial (transformers 4.x experts)",
    "local_rowwise": "a rowwise split whose output stays partial (transformers 4.x experts)",
    "local": "transformers 4.x isolated expert modules",
    "moe_tp_experts": "mixture-of-experts experts",
    "moe_identity_expert": "mixture-of-experts identity experts",
    "ep_router": "expert-parallel routers",
    "ep_dispatch_experts": "expert-parallel experts",
    "grouped_gemm": "expert-parallel grouped GEMMs",
    "local_params": "bare parameters sharded by their own entry",
    "isolated": "transformers 4.x isolated modules",
}
"""transformers styles torch has no native `ParallelStyle` for: refused, naming the style."""


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
    """The torch `ParallelStyle` for a plan entry (a name of STYLE_NAMES or a style object); None for a
    replicated style (the entry is skipped).

    Raises:
        ValueError: a refused or unknown style name, naming it and the supported ones.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import parallel as tp

    if isinstance(style, tp.ParallelStyle):
        return style
    if isinstance(style, str) and style in REPLICATED_STYLES:
        return None
    if isinstance(style, str) and style in _STYLES:
        cls, kwargs = _STYLES[style]
        return getattr(tp, cls)(**{k: Replicate() for k in kwargs})
    supported = f"accel applies {STYLE_NAMES} or a torch ParallelStyle (torch.distributed.tensor.parallel)"
    if isinstance(style, str) and style in REFUSED_STYLES:
        raise ValueError(
            f"The tensor-parallel style {style!r} ({REFUSED_STYLES[style]}) is not supported by accel: torch has no "
            f"native style with its semantics; {supported}. Give ParallelismConfig(tp_plan=...) a plan without it "
            "(the modules left out keep their full weights on every rank)."
        )
    raise ValueError(f"Unknown tensor-parallel style {style!r}; {supported}.")


def model_tp_size(model: nn.Module) -> int | None:
    """The tensor-parallel size of a model that is already split (DTensor weights on a mesh with a `tp` dimension
    or a one-dimensional mesh, as transformers' `from_pretrained(tp_plan=...)` and `parallelize_module` leave
    it); None for a model that is not."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            mesh = p.device_mesh
            names = mesh.mesh_dim_names or ()
            if "tp" in names:
                return int(mesh["tp"].size())
            if mesh.ndim == 1:
                return int(mesh.size())
    return None


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: dict[str, Any] | None) -> None:
    """Split `model`'s layers over `tp_mesh` in place following `plan` (else the model's own plan).

    A model that is already tensor-parallel (`model_tp_size`) is left as it is.

    Raises:
        ValueError: no plan anywhere, a refused or unknown style, a pattern that matches no module, or an
            already split model whose tensor-parallel size is not the mesh's.
    """
    import fnmatch

    from torch.distributed.tensor.parallel import parallelize_module

    already = model_tp_size(model)
    if already is not None:
        if already != tp_mesh.size():
            raise ValueError(
                f"tp_size in the plugin {tp_mesh.size()} should be same as model's tp size {already}: the model was "
                f"split over {already} processes before prepare; load it with the Accelerator's "
                "torch_device_mesh, or set tp_size to match."
            )
        return
    plan = dict(plan) if plan else model_tp_plan(model)
    if not plan:
        raise ValueError(
            "tp_size > 1 needs a tensor-parallel plan: give the model a `tp_plan` dict (module-name pattern -> "
            "'colwise'/'rowwise'/...), as transformers models carry, or pass ParallelismConfig(tp_plan=...)."
        )
    styles = {pattern: parallel_style(style) for pattern, style in plan.items()}
    styles = {pattern: style for pattern, style in styles.items() if style is not None}
    names = [n for n, _ in model.named_modules() if n]
    missing = [p for p in styles if not any(fnmatch.fnmatchcase(n, p) and n.count(".") == p.count(".") for n in names)]
    if missing:
        raise ValueError(f"The tensor-parallel plan names modules the model does not have: {missing}.")
    parallelize_module(model, tp_mesh, styles)
