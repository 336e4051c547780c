"""Checks that a loaded state fits the live object, run before anything is applied.

`torch.nn.Module.load_state_dict` copies every matching tensor before it reports a missing
key or a wrong shape, and `Optimizer.load_state_dict` accepts state tensors of any shape:
both would leave the live objects half-overwritten or silently wrong. These checks raise a
`CheckpointError` naming the file first, so a failed `load_state` changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError


def check_model_state(live: dict[str, Any], loaded: dict[str, Any], path: Path, *, strict: bool) -> None:
    """`loaded` has every key of `live` (when `strict`), no others, and each tensor's shape."""
    if strict:
        missing = sorted(set(live) - set(loaded))
        unexpected = sorted(set(loaded) - set(live))
        if missing or unexpected:
            raise CheckpointError(
                f"Checkpoint file {path} does not fit the model: missing keys {_few(missing)}, unexpected keys "
                f"{_few(unexpected)}. Nothing was loaded. Prepare the same model that was saved, or pass strict=False."
            )
    wrong = [
        f"{k}: saved {tuple(v.shape)}, model {tuple(live[k].shape)}"
        for k, v in loaded.items()
        if k in live and isinstance(v, torch.Tensor) and isinstance(live[k], torch.Tensor) and v.shape != live[k].shape
    ]
    if wrong:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the model (shape mismatch: {_few(wrong)}). Nothing was loaded."
        )


def check_optimizer_state(optimizer: torch.optim.Optimizer, loaded: Any, path: Path) -> None:
    """`loaded` is an optimizer state dict for the same parameter groups, with state of matching shapes."""
    if not isinstance(loaded, dict) or not isinstance(loaded.get("param_groups"), list) or "state" not in loaded:
        raise CheckpointError(f"Checkpoint file {path} is not an optimizer state dict. Nothing was loaded.")
    groups = optimizer.param_groups
    saved_sizes = [len(g.get("params", [])) for g in loaded["param_groups"]]
    live_sizes = [len(g["params"]) for g in groups]
    if saved_sizes != live_sizes:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the optimizer: parameter groups of sizes {saved_sizes} were saved, "
            f"the optimizer has {live_sizes}. Nothing was loaded."
        )
    ids = [pid for g in loaded["param_groups"] for pid in g["params"]]
    params = {pid: p for pid, p in zip(ids, (p for g in groups for p in g["params"]))}
    for pid, state in loaded["state"].items():
        param = params.get(pid)
        if param is None or not isinstance(state, dict):
            raise CheckpointError(f"Checkpoint file {path} holds state for an unknown parameter {pid!r}.")
        for key, value in state.items():
            # State shaped like its parameter (Adam's moments) must match it; factored or scalar
            # state (Adafactor's rows, step counters) has fewer dimensions and is left alone.
            if isinstance(value, torch.Tensor) and value.dim() == param.dim() > 0 and value.shape != param.shape:
                raise CheckpointError(
                    f"Checkpoint file {path} does not fit the optimizer: state {key!r} of parameter {pid} has shape "
                    f"{tuple(value.shape)}, the parameter {tuple(param.shape)}. Nothing was loaded."
                )


def check_mapping(value: Any, path: Path, what: str) -> None:
    """`value` is a dict (a state dict of a scheduler, scaler or registered object)."""
    if not isinstance(value, dict):
        raise CheckpointError(f"Checkpoint file {path} does not hold a {what} state (got {type(value).__name__}).")


def check_loader_states(value: Any, path: Path) -> None:
    """`dataloaders.json` is a list of loader states (each a dict; the loader checks its own fields)."""
    if not (isinstance(value, list) and all(isinstance(s, dict) for s in value)):
        raise CheckpointError(f"Checkpoint file {path} does not hold data loader positions. Nothing was loaded.")


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit]) or "none"
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")
