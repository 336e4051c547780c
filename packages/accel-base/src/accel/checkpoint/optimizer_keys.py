"""An optimizer's saved state, keyed the way the run that loads it needs.

A plain torch optimizer (one process, DDP) numbers its parameters: `state` and each group's
`params` hold positions in the order of its parameter groups. FSDP2's state dicts (full or
sharded, `torch.distributed.checkpoint.state_dict`) name them by their model's state-dict
keys. A checkpoint saved under one layout and loaded under the other is re-keyed here, through
the names of the live optimizer's parameters, and its groups are rebuilt in the live order, so
that every state lands on the parameter it was saved for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

# Module wrappers that insert a segment into parameter names but not into the state dict torch's
# get_model_state_dict writes (activation checkpointing, torch.compile, FSDP1).
_WRAPPER_SEGMENTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})


def parameter_names(optimizer: torch.optim.Optimizer, modules: list[torch.nn.Module]) -> list[str] | None:
    """The state-dict name of each parameter `optimizer` updates, in the order torch numbers them.

    None when a parameter belongs to none of `modules`, or two of them share a name.
    """
    names: dict[int, str] = {}
    for module in modules:
        for name, param in module.named_parameters():
            names.setdefault(id(param), ".".join(s for s in name.split(".") if s not in _WRAPPER_SEGMENTS))
    found = [names.get(id(p)) for group in optimizer.param_groups for p in group["params"]]
    if any(n is None for n in found) or len(set(found)) != len(found):
        return None
    return [n for n in found if n is not None]


def rekey(
    saved: Any, optimizer: torch.optim.Optimizer, names: list[str] | None, *, by_name: bool, path: Path
) -> dict[str, Any]:
    """`saved` (an optimizer state dict keyed by position or by name) keyed by name or by position for `optimizer`.

    `names` are the live parameters' names (`parameter_names`). The groups come back in the
    live order, each with its saved hyperparameters.

    Raises:
        CheckpointError: `saved` is no optimizer state dict, its groups hold other parameters
            than the live optimizer's, or it needs names that the live run cannot give.
    """
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) or "state" not in saved:
        raise CheckpointError(f"Checkpoint file {path} is not an optimizer state dict. Nothing was loaded.")
    live_groups = [len(g["params"]) for g in optimizer.param_groups]
    saved_groups = [list(g.get("params", [])) if isinstance(g, dict) else [] for g in saved["param_groups"]]
    if [len(g) for g in saved_groups] != live_groups:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the optimizer: parameter groups of sizes "
            f"{[len(g) for g in saved_groups]} were saved, the optimizer has {live_groups}. Nothing was loaded."
        )
    saved_by_name = any(isinstance(p, str) for g in saved_groups for p in g)
    if names is None and (by_name or saved_by_name):
        raise CheckpointError(
            f"Checkpoint file {path} keys the optimizer's state by parameter name (a sharded run's layout) or this "
            "run needs it so, but the optimizer updates parameters of no prepared model (or two of them share a "
            "name). Prepare the optimizer with its model. Nothing was loaded."
        )
    starts = [sum(live_groups[:j]) for j in range(len(live_groups))]
    position: dict[Any, int] = {}
    for j, group in enumerate(saved_groups):
        live = range(starts[j], starts[j] + live_groups[j])
        if saved_by_name:
            assert names is not None
            mine = {names[p]: p for p in live}
            if set(group) != set(mine):
                raise CheckpointError(
                    f"Checkpoint file {path} does not fit the optimizer: its parameter group {j} holds "
                    f"{sorted(set(group) - set(mine))[:4]} where the model has {sorted(set(mine) - set(group))[:4]}. "
                    "Nothing was loaded."
                )
            position.update({key: mine[key] for key in group})
        else:
            position.update(zip(group, live))

    def key(p: int) -> Any:
        return names[p] if by_name and names is not None else p

    unknown = [k for k in saved["state"] if k not in position]
    if unknown:
        raise CheckpointError(f"Checkpoint file {path} holds state for an unknown parameter {unknown[0]!r}.")
    return {
        "state": {key(position[k]): v for k, v in saved["state"].items()},
        "param_groups": [
            {**g, "params": [key(p) for p in range(starts[j], starts[j] + live_groups[j])]}
            for j, g in enumerate(saved["param_groups"])
        ],
    }
