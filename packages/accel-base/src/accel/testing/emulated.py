"""Building blocks for an adapter's emulated vendor module (its `emulated_vendor_module`).

A stand-in is a plain module with the same functions as the adapter's vendor module. These
pieces save writing the parts every stand-in needs::

    from collections import Counter
    from accel.testing.emulated import DeviceGenerators, device_count_from_env

    calls: Counter[str] = Counter()          # tests assert where the adapter makes device calls
    _rng = DeviceGenerators(lambda: device_count_from_env("MYDEV_VISIBLE_DEVICES"))
    generator, get_rng_state, set_rng_state, manual_seed = (
        _rng.generator, _rng.get_rng_state, _rng.set_rng_state, _rng.manual_seed)

    def device_count() -> int:
        return device_count_from_env("MYDEV_VISIBLE_DEVICES")

    def set_device(index: int) -> None:
        calls["set_device"] += 1

The conformance kit records every call into the stand-in by itself (`record_calls`), and draws
from `generator(index)` in its training, so a stand-in that exposes `generator` gets its device
RNG checked: seeded by `set_seed`, saved by `save_state`, restored exactly by `load_state`.

It also checks that the adapter makes the device current before the process group starts:
the stand-in's current-device setters (`CURRENT_DEVICE_SETTERS`, by default `("set_device",)`
when the stand-in has a `set_device`) must be called before `init_process_group`, with the
local rank's index when they take one. A device that is one per process and has no setter
(its runtime binds the process to its device) leaves `set_device` out and sets
`CURRENT_DEVICE_SETTERS = ()`: then some call into the stand-in made by the adapter's
`set_device` or `before_process_group` hook (registering the backend, say) must stand for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch


def device_count_from_env(visible_devices_variable: str | None = None) -> int:
    """Emulated devices on this host: as many as `visible_devices_variable` lists (e.g.
    "0,1"; "-1" or empty hides them), else one per local process (`LOCAL_WORLD_SIZE`)."""
    visible = os.environ.get(visible_devices_variable) if visible_devices_variable else None
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


class DeviceGenerators:
    """One real `torch.Generator` per emulated device, with the vendor RNG functions over them.

    Args:
        count: how many devices there are (an int, or a function read on each use, so that
            the launcher's environment is seen).
    """

    def __init__(self, count: int | Callable[[], int] = 1) -> None:
        self._count = count
        self._generators: list[torch.Generator] = []

    def _all(self) -> list[torch.Generator]:
        count = self._count() if callable(self._count) else self._count
        while len(self._generators) < count:
            self._generators.append(torch.Generator())
        return self._generators

    def generator(self, index: int = 0) -> torch.Generator:
        """Emulated device `index`'s generator: draw from it where device code draws on the device."""
        return self._all()[index]

    def get_rng_state(self) -> list[torch.Tensor]:
        """Every device generator's state (what `torch.<device>.get_rng_state_all()` returns)."""
        return [g.get_state() for g in self._all()]

    def set_rng_state(self, states: list[torch.Tensor]) -> None:
        """Restore `get_rng_state`'s result."""
        for g, s in zip(self._all(), states):
            g.set_state(s)

    def manual_seed(self, seed: int) -> None:
        """Seed every device generator (`torch.<device>.manual_seed_all`)."""
        for g in self._all():
            g.manual_seed(seed)

    def reset(self) -> None:
        """Forget every generator (tests start each case from fresh devices)."""
        self._generators.clear()


@dataclass
class VendorCall:
    """One call into a stand-in, as `record_calls` saw it."""

    name: str
    args: tuple[Any, ...]
    process_group_started: bool
    """Whether `torch.distributed` was initialised when the call was made."""
    hook: str | None = None
    """The adapter hook (`within`) that was running when the call was made, if any."""


@dataclass
class CallRecord:
    """Every call made into an instrumented stand-in, in order."""

    module: str
    calls: list[VendorCall] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    """The adapter hooks running now, innermost last (see `within`)."""

    @contextlib.contextmanager
    def within(self, hook: str) -> Iterator[None]:
        """Tag the calls made inside the block with `hook` (the kit wraps the adapter's device hooks)."""
        self.hooks.append(hook)
        try:
            yield
        finally:
            self.hooks.pop()

    def names(self) -> list[str]:
        return [c.name for c in self.calls]

    def since(self, start: int) -> list[str]:
        """Names of the calls made after the first `start` ones (`len(record.calls)` taken before)."""
        return [c.name for c in self.calls[start:]]


def record_calls(module: ModuleType) -> CallRecord:
    """Wrap every public function of `module` (in place) so that each call is recorded.

    The module's own functions and the bound methods it exposes (`generator = _rng.generator`);
    classes, constants and imported functions are left alone. Idempotent per module."""
    existing = getattr(module, "__accel_call_record__", None)
    if isinstance(existing, CallRecord):
        return existing
    record = CallRecord(module.__name__)

    def wrap(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            started = torch.distributed.is_available() and torch.distributed.is_initialized()
            record.calls.append(VendorCall(name, args, started, record.hooks[-1] if record.hooks else None))
            return function(*args, **kwargs)

        return recorded

    for name, value in list(vars(module).items()):
        own_function = inspect.isfunction(value) and value.__module__ == module.__name__
        # Bound methods too: `generator = _rng.generator` (a `DeviceGenerators` exposed as functions).
        if name.startswith("_") or not (own_function or inspect.ismethod(value)):
            continue
        setattr(module, name, wrap(name, value))
    module.__accel_call_record__ = record  # type: ignore[attr-defined]
    return record


def current_device_setters(module: ModuleType) -> tuple[str, ...]:
    """The stand-in's functions that make a device current: its `CURRENT_DEVICE_SETTERS`, else
    `("set_device",)` when it has a `set_device`, else none."""
    declared = getattr(module, "CURRENT_DEVICE_SETTERS", None)
    if declared is not None:
        return tuple(declared)
    return ("set_device",) if callable(getattr(module, "set_device", None)) else ()
