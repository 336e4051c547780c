"""Configuration objects built with the real Accelerate, passed to accel: converted with a warning, or refused.

A script that still imports a kwargs handler or plugin from `accelerate.utils` (both
packages installed) hands accel an object of the other library. Dropping it silently would
lose settings (`find_unused_parameters=True` disappearing), so each one is converted to
accel's class of the same name (the fields the user set; the others keep accel's defaults),
with a warning naming the accel import, or,
when accel has no such class or lacks a field the object sets, refused with an error that
says what to use.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import warnings
from typing import Any

from .. import utils
from ..errors import AccelError


class AccelerateObjectError(AccelError, TypeError):
    """An object of the real Accelerate that accel cannot take over faithfully."""


def is_accelerate_object(obj: Any) -> bool:
    """Whether `obj` was built from the real Accelerate (not accel, nor accel under its name)."""
    return type(obj).__module__.split(".")[0] == "accelerate"


def _accel_class(name: str) -> type | None:
    """accel's class of that name in `accel.utils`, where Accelerate keeps its configuration classes."""
    try:
        found = getattr(utils, name)
    except (AttributeError, NotImplementedError):
        return None
    return found if isinstance(found, type) else None


def _convert_value(value: Any) -> Any:
    if isinstance(value, enum.Enum) and is_accelerate_object(value):
        target = _accel_class(type(value).__name__)
        return target(value.value) if target is not None else value.value
    return value


def convert(obj: Any, role: str) -> Any:
    """accel's equivalent of Accelerate's `obj` (returned unchanged if it is not one of those).

    Raises:
        AccelerateObjectError: accel has no class of that name, or the object sets a field
            accel's class does not have.
    """
    if obj is None or not is_accelerate_object(obj):
        return obj
    name = type(obj).__name__
    target = _accel_class(name)
    if target is None or not dataclasses.is_dataclass(target) or not dataclasses.is_dataclass(obj):
        raise AccelerateObjectError(
            f"{role}: accelerate.utils.{name} (from the real accelerate package) has no accel counterpart. "
            "See docs/accelerate_compat.md for what accel supports, and import configuration from `accel.utils`."
        )
    accepted = {f.name: f for f in dataclasses.fields(target) if f.init}
    values: dict[str, Any] = {}
    lost: list[str] = []
    for field in dataclasses.fields(obj):
        if not field.init:
            continue
        value = getattr(obj, field.name)
        # Only what the user set: a field left at Accelerate's default takes accel's default.
        if value == _default(field):
            continue
        if field.name in accepted:
            values[field.name] = _convert_value(value)
        else:
            lost.append(f"{field.name}={value!r}")
    if lost:
        raise AccelerateObjectError(
            f"{role}: accelerate.utils.{name} sets {', '.join(lost)}, which accel's {name} does not have. "
            f"Use `from accel.utils import {name}` and see docs/accelerate_compat.md for the equivalent settings."
        )
    try:
        converted = target(**values)
    except (TypeError, ValueError) as exc:
        raise AccelerateObjectError(
            f"{role}: accelerate.utils.{name} could not be converted to accel's ({exc}). "
            f"Build it with `from accel.utils import {name}`."
        ) from exc
    warnings.warn(
        f"{role}: converted accelerate.utils.{name} (from the real accelerate package) to accel's {name}; "
        f"import it with `from accel.utils import {name}`.",
        UserWarning,
        stacklevel=user_stacklevel(),
    )
    return converted


def user_stacklevel() -> int:
    """The `stacklevel` that attributes a warning to the first caller outside accel (the user's line that built
    the Accelerator), however deep in accel the warning is raised."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel/
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def convert_accelerator_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """The Accelerator's configuration arguments with every object of the real Accelerate converted (see `convert`)."""
    out = dict(arguments)
    for role, value in arguments.items():
        if role == "kwargs_handlers" and value is not None:
            out[role] = [convert(handler, "kwargs_handlers") for handler in value]
        else:
            out[role] = convert(value, role)
    return out


_TRACKER_METHODS = ("log", "store_init_configuration", "finish")


def _from_accelerate(cls: type) -> bool:
    return any(base.__module__.split(".")[0] == "accelerate" for base in cls.__mro__)


def adopt_tracker(item: Any) -> Any:
    """A `log_with` item that is not a name: a tracker object accel can drive, returned as it is.

    A tracker built on the real `accelerate.tracking.GeneralTracker` (both packages installed)
    has accel's tracker interface (`name`, `start`, `store_init_configuration`, `log`,
    `finish`, `tracker`), so accel's `init_trackers`, `log`, `get_tracker` and
    `end_training` drive it unchanged; its `@on_main_process` methods consult Accelerate's
    own `PartialState`, which agrees with accel's on which process is the main one.

    Raises:
        AccelerateObjectError: a tracker class rather than an instance, or an Accelerate
            object without the tracker interface.
    """
    if isinstance(item, type):
        raise AccelerateObjectError(
            f"log_with: {item.__qualname__} is a tracker class; pass an instance ({item.__qualname__}(...)), "
            "or register the class with `accel.tracking.register_tracker_class` and pass its `name`."
        )
    if not _from_accelerate(type(item)):
        return item
    missing = [attr for attr in ("name", *_TRACKER_METHODS) if not callable(getattr(item, attr, None))]
    if "name" in missing and isinstance(getattr(item, "name", None), str):
        missing.remove("name")
    if missing:
        raise AccelerateObjectError(
            f"log_with: {type(item).__qualname__} (from the real accelerate package) is not a tracker: it lacks "
            f"{', '.join(missing)}. Pass a tracker name, or an instance of an `accel.tracking.GeneralTracker` "
            "subclass."
        )
    return item
