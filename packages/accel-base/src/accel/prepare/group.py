"""How `prepare` pairs a model with its optimizers and schedulers, and follows replaced parameters.

Two pieces the prepare walk (`Accelerator.prepare`) uses, independent of any strategy:

- `group_objects` sorts the objects of one `prepare` call into `PrepareGroup`s by
  parameter identity: each optimizer joins the model whose parameters it holds, each
  scheduler joins its optimizer. A strategy receives each group once, through
  `Strategy.setup(group, prepared, ctx)`, and returns it with whatever its engine replaced.
- `ParameterMap` remembers, for every parameter that preparing a model replaced (placement
  on a device whose tensors cannot share storage with the CPU ones, `fully_shard`'s
  DTensors), the parameter that replaced it, and re-points optimizers at the new ones —
  the optimizers of the same call and those prepared in a later call alike.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import PrepareError
from ..settings.env import DETACHED_OPTIMIZERS_VARIABLE

# Module-name prefixes that wrappers insert without changing which parameter is meant.
_TRANSPARENT_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")

STATE_ON_RESHAPED = (
    "The optimizer already has state (it has stepped) for parameters that `prepare` replaced with tensors of "
    "another shape or kind (shards, DTensors); that state cannot be moved onto them. Create the optimizer fresh before `prepare`, "
    "and restore its state afterwards with `load_state`."
)


def canonical_name(name: str) -> str:
    """A parameter's name with wrapper prefixes (activation checkpointing, `torch.compile`) removed."""
    for prefix in _TRANSPARENT_PREFIXES:
        name = name.replace(prefix, "")
    return name


@dataclass
class PrepareGroup:
    """One model with the optimizers that train it and their schedulers, as one `prepare` call gave them.

    `model` is the prepared model (None for optimizers prepared without their model);
    `optimizers` and `schedulers` are the objects inside accel's wrappers (the
    `AcceleratedOptimizer.optimizer`, the `AcceleratedScheduler.scheduler`). A strategy's
    `setup` returns the group with any of them replaced; the core puts the replacements
    into the prepared objects and the registry, and schedulers follow a replaced optimizer.
    """

    model: torch.nn.Module | None = None
    optimizers: list[Any] = field(default_factory=list)
    schedulers: list[Any] = field(default_factory=list)

    def replace(self, **changes: Any) -> PrepareGroup:
        """A copy with some fields changed (`group.replace(model=engine)`)."""
        values: dict[str, Any] = {
            "model": self.model,
            "optimizers": list(self.optimizers),
            "schedulers": list(self.schedulers),
        }
        values.update(changes)
        return PrepareGroup(**values)


@dataclass
class GroupIndex:
    """Positions, in one `prepare` call's arguments, of a group's model, optimizers and schedulers."""

    model: int | None = None
    optimizers: list[int] = field(default_factory=list)
    schedulers: list[int] = field(default_factory=list)


def optimizer_params(optimizer: Any) -> list[torch.Tensor]:
    """The parameters an optimizer (or a view on one) holds, in order."""
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def group_objects(objects: Sequence[Any], *, is_model: Any, is_optimizer: Any, is_scheduler: Any) -> list[GroupIndex]:
    """Sort the positions of `objects` into groups by parameter identity.

    An optimizer joins the first model (in argument order) that holds one of its parameters;
    a scheduler joins the group of its optimizer. Optimizers and schedulers with no partner
    in the call form groups of their own. Objects that are none of the three are left out.
    """
    groups: list[GroupIndex] = []
    owner: dict[int, GroupIndex] = {}
    for i, obj in enumerate(objects):
        if is_model(obj):
            group = GroupIndex(model=i)
            groups.append(group)
            for param in obj.parameters():
                owner.setdefault(id(param), group)
    by_optimizer: dict[int, GroupIndex] = {}
    for i, obj in enumerate(objects):
        if not is_optimizer(obj):
            continue
        found = next((owner[id(p)] for p in optimizer_params(obj) if id(p) in owner), None)
        if found is None:
            found = GroupIndex()
            groups.append(found)
        found.optimizers.append(i)
        by_optimizer[id(obj)] = found
        by_optimizer[id(getattr(obj, "optimizer", obj))] = found
    for i, obj in enumerate(objects):
        if not is_scheduler(obj):
            continue
        found = by_optimizer.get(id(getattr(obj, "optimizer", None)))
        if found is None:
            found = GroupIndex()
            groups.append(found)
        found.schedulers.append(i)
    return groups


class ParameterMap:
    """Old parameter -> the parameter that replaced it while a model was prepared.

    Both are held weakly: an entry lives while both tensors do (the old one alive means an
    optimizer may still hold it; an id is never reused while its object lives).
    """

    def __init__(self) -> None:
        self._moved: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor]]] = {}

    @staticmethod
    def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's parameters by canonical name (every name of a tied weight)."""
        return {canonical_name(n): p for n, p in model.named_parameters(remove_duplicate=False)}

    def record(self, before: dict[str, torch.Tensor], after: torch.nn.Module) -> int:
        """Remember the parameters of `after` that replaced those in `before` (same name); returns how many."""
        count = 0
        for name, new in self.snapshot(after).items():
            old = before.get(name)
            if old is not None and old is not new:
                self._moved[id(old)] = (weakref.ref(old), weakref.ref(new))
                count += 1
        self._prune()
        return count

    def __len__(self) -> int:
        return len(self._moved)

    def new(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter that replaced `param`, or `param` itself."""
        entry = self._moved.get(id(param))
        if entry is None or entry[0]() is not param:
            return param
        new = entry[1]()
        return param if new is None else new

    def repoint(self, optimizer: Any) -> int:
        """Make `optimizer` train the replacing parameters; returns how many it re-pointed.

        State the optimizer already holds moves with its parameter when the shapes agree
        (re-keyed by torch's own `load_state_dict`, which casts it to the new device and dtype).

        Raises:
            PrepareError: the optimizer has state for a parameter replaced by one of another shape.
        """
        if not self._moved:
            return 0
        pairs = [(p, self.new(p)) for p in optimizer_params(optimizer)]
        changed = [(old, new) for old, new in pairs if new is not old]
        if not changed:
            return 0
        saved = None
        if optimizer.state:
            if any(_reshaped(old, new) and old in optimizer.state for old, new in changed):
                raise PrepareError(STATE_ON_RESHAPED)
            # state_dict() keys state by position, so it survives the swap of objects.
            saved = optimizer.state_dict()
        for group in optimizer.param_groups:
            group["params"] = [self.new(p) for p in group["params"]]
        if saved is not None:
            optimizer.state.clear()
            optimizer.load_state_dict(saved)
        return len(changed)

    def _prune(self) -> None:
        for key in [k for k, (old, new) in self._moved.items() if old() is None or new() is None]:
            del self._moved[key]


def _reshaped(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether optimizer state for `old` cannot simply be cast onto `new` (another shape, or a tensor
    subclass such as a DTensor shard whose local shape differs from the shape it reports)."""
    return old.shape != new.shape or type(old) is not type(new)


_SCHEDULER_TYPES: tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler,)


def is_scheduler(obj: Any) -> bool:
    """Whether `obj` is a learning-rate scheduler (torch's, or one shaped like it)."""
    return isinstance(obj, _SCHEDULER_TYPES) or (
        hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "get_last_lr")
    )


def is_prepared(obj: Any) -> bool:
    """Whether `prepare` returned `obj` already (it is then handed back unchanged)."""
    return bool(getattr(obj, "_is_accel_prepared", False))


def holds_parameters_of(obj: Any, model: torch.nn.Module) -> bool:
    """Whether `obj` is an optimizer holding a parameter of `model`."""
    if not isinstance(obj, torch.optim.Optimizer):
        return False
    params = {id(p) for p in model.parameters()}
    return any(id(p) in params for p in optimizer_params(obj))


def kind_of(obj: Any) -> str | None:
    """ "model", "loader", "optimizer", "scheduler", or None for anything else (and for None)."""
    if obj is None:
        return None
    if isinstance(obj, torch.nn.Module):
        return "model"
    if isinstance(obj, torch.utils.data.DataLoader):
        return "loader"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if is_scheduler(obj):
        return "scheduler"
    return None


def check_detached_optimizers(
    optimizers: list[Any], prepared_models: list[torch.nn.Module], *, allowed: bool = False
) -> None:
    """Refuse an optimizer that shares no parameter with any model of this Accelerator: it would train nothing.

    `allowed` (`ACCEL_ALLOW_DETACHED_OPTIMIZERS=1`): the rare intended case (an optimizer over tensors outside
    every model) passes.

    Raises:
        PrepareError: naming the optimizer, how many tensors it holds, and the two ways out.
    """
    if not prepared_models or allowed:
        return
    owned = {id(p) for model in prepared_models for p in model.parameters()}
    for obj in optimizers:
        if not isinstance(obj, torch.optim.Optimizer):
            continue
        params = optimizer_params(obj)
        if params and not any(id(p) in owned for p in params):
            raise PrepareError(
                f"The {type(obj).__name__} optimizer passed to `prepare` holds {len(params)} parameter tensor(s), none "
                "of which belongs to a model prepared by this Accelerator, so stepping it would train none of them. "
                "Build the optimizer from the model's own parameters (`optimizer = torch.optim.AdamW(model.parameters())`) "
                "and pass both to the same `prepare` call. If it is meant to train tensors outside every model, set "
                f"{DETACHED_OPTIMIZERS_VARIABLE}=1."
            )
