"""Placement helpers for a device whose `module.to(device)` replaces Parameters.

Moving a module to an XLA device does not move its Parameters in place: `module.to(xla)`
gives it new Parameter objects. An optimizer built before the move would still hold the old
ones and silently update nothing (measured: weights unchanged, no error); the core re-points
it (`accel.prepare.group.ParameterMap`, by name, state included). Left here: weights tied
before the move come out as separate copies, which `tied_groups`/`retie` tie again.
"""

from __future__ import annotations

from typing import Any

import torch


def first_device(tensors: Any) -> torch.device | None:
    """Device of the first tensor in `tensors`, or None when there is none."""
    return next((t.device for t in tensors), None)


def tied_groups(model: torch.nn.Module) -> list[list[str]]:
    """Names that share one Parameter (tied weights), one list per shared Parameter."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def retie(model: torch.nn.Module, groups: list[list[str]]) -> None:
    """Make every name in each group refer to the first name's Parameter again.

    A conversion that replaces Parameters replaces each module's own reference separately,
    so weights tied before the move come out as independent copies.
    """
    for names in groups:
        keep = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, attr, keep)
