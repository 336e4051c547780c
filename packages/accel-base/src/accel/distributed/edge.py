"""What the edge installs into the engine's process state: the environment translation that runs before every
environment read (`accel.compat` turns `accelerate launch`'s ACCELERATE_* variables into accel's), and the error
for a member accel lacks. The engine never imports `accel.compat`; `accel/__init__.py` calls `register_edge`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..settings.env import EnvSettings, read_env


def _python_missing_member(owner: str, name: str) -> AttributeError:
    return AttributeError(f"'{owner}' object has no attribute '{name}'")


# What the edge installs (`register_edge`): the engine never imports `accel.compat`.
_before_state: list[Callable[[], object]] = []
_missing_member: Callable[[str, str], AttributeError] = _python_missing_member


def register_edge(*, before: Callable[[], object], missing: Callable[[str, str], AttributeError]) -> None:
    """Install the edge's hooks (`accel/__init__.py` does, so every `import accel.x` has them in place).

    `before` runs, once per registration, ahead of every environment read by a state (`accel.compat` turns
    `accelerate launch`'s ACCELERATE_* variables into accel's there); `missing` gives the error for a member
    accel lacks (`accel.compat.table.missing_member` says why accel lacks an Accelerate member; without it,
    Python's own message).
    """
    global _missing_member
    if before not in _before_state:
        _before_state.append(before)
    _missing_member = missing


def missing_member(owner: str, name: str) -> AttributeError:
    """The error for reading `name` from `owner` ("PartialState", "Accelerator", ...) when it lacks it."""
    return _missing_member(owner, name)


def build_env() -> EnvSettings:
    """The environment, read after the edge's hooks ran (they may translate variables)."""
    for hook in _before_state:
        hook()
    return read_env()


def member_miss(obj: Any, owner: str, name: str) -> AttributeError:
    """The error for `obj.name` that `owner`'s `__getattr__` raises (Python calls it only on a miss).

    A property whose getter raised AttributeError lands here too: it is run again so that its own error
    propagates (not one naming the property). Otherwise `compat_table.missing_member`: an Accelerate member accel
    lacks says why and what to use; any other name gets Python's message, naming `owner`.
    """
    if name.startswith("__"):
        return AttributeError(f"'{owner}' object has no attribute '{name}'")
    attr = inspect.getattr_static(type(obj), name, None)
    if isinstance(attr, property) and attr.fget is not None:
        try:
            attr.fget(obj)
        except AttributeError as exc:
            return exc
    error = missing_member(owner, name)
    if type(obj).__name__ != owner and type(error) is AttributeError:
        return AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'")  # a user's subclass
    return error
