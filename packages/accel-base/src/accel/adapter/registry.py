"""Find adapters and strategies through entry points, and pick one.

Adapters live in the entry-point group `accel.adapter`, strategies in
`accel.strategies`. A plugin that fails to load is recorded with its error and skipped:
one broken package never stops the others. Selection order for adapters:
`Accelerator(adapter=...)`, then `ACCEL_ADAPTER`, then the available adapter with the
highest priority, then the built-in `cpu` adapter.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import AdapterNotFoundError, AdapterUnavailableError, StrategyNotFoundError
from ..settings.env import BROKEN_ADAPTERS_VARIABLE, read_env
from .base import (
    ADAPTER_API_VERSION,
    DEPRECATED_ADAPTER_API_VERSIONS,
    LEGACY_PREPARE_HOOKS,
    REMOVED_ADAPTER_HOOKS,
    SUPPORTED_ADAPTER_API_VERSIONS,
    Adapter,
    Availability,
)
from .legacy import legacy_hooks

ADAPTER_GROUP = "accel.adapter"
STRATEGY_GROUP = "accel.strategies"
BUILTIN_ADAPTER = "cpu"


@dataclass(kw_only=True, frozen=True)
class PluginRecord:
    """One entry point: what it is, where it came from, and what happened loading it."""

    name: str
    value: str
    distribution: str
    loaded: Any = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.loaded is not None


def _load_group(group: str) -> dict[str, PluginRecord]:
    records: dict[str, PluginRecord] = {}
    for ep in importlib.metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "?"
        if ep.name in records and records[ep.name].ok:
            # Two distributions claim the same name: keep the first, say so in `accel env`.
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin is reported, never fatal to the others
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            records[ep.name] = PluginRecord(name=ep.name, value=ep.value, distribution=dist, error=last)
            continue
        records[ep.name] = PluginRecord(name=ep.name, value=ep.value, distribution=dist, loaded=obj)
    return records


@functools.cache
def adapter_records() -> dict[str, PluginRecord]:
    """Every entry point in `accel.adapter`, loaded or with its load error."""
    records = _load_group(ADAPTER_GROUP)
    for name, rec in list(records.items()):
        cls = rec.loaded
        if rec.ok and not (isinstance(cls, type) and issubclass(cls, Adapter)):
            records[name] = PluginRecord(
                name=name,
                value=rec.value,
                distribution=rec.distribution,
                error=f"{rec.value} is not a subclass of accel.adapter.Adapter",
            )
        elif rec.ok and _removed_hooks(cls, Adapter, REMOVED_ADAPTER_HOOKS):
            records[name] = PluginRecord(
                name=name,
                value=rec.value,
                distribution=rec.distribution,
                error=_removed_hooks(cls, Adapter, REMOVED_ADAPTER_HOOKS),
            )
        elif rec.ok and declared_api_version(cls) not in (None, *DEPRECATED_ADAPTER_API_VERSIONS) and legacy_hooks(cls):
            records[name] = PluginRecord(
                name=name,
                value=rec.value,
                distribution=rec.distribution,
                error=_legacy_refusal(cls),
            )
        elif rec.ok and cls.api_version not in SUPPORTED_ADAPTER_API_VERSIONS:
            records[name] = PluginRecord(
                name=name,
                value=rec.value,
                distribution=rec.distribution,
                error=(
                    f"built for adapter API {cls.api_version}, this accel-base speaks "
                    f"{sorted(SUPPORTED_ADAPTER_API_VERSIONS)} (current {ADAPTER_API_VERSION}); "
                    f"upgrade {rec.distribution} or accel-base so they match"
                ),
            )
    if BUILTIN_ADAPTER not in records or not records[BUILTIN_ADAPTER].ok:
        # Running from a source tree without installed metadata still has the cpu adapter.
        from .cpu import CPUAdapter

        records[BUILTIN_ADAPTER] = PluginRecord(
            name=BUILTIN_ADAPTER, value="accel.adapter.cpu:CPUAdapter", distribution="accel-base", loaded=CPUAdapter
        )
    return records


def declared_api_version(cls: type[Adapter]) -> int | None:
    """The `api_version` the adapter class (or a class between it and `Adapter`) sets itself; None when it
    inherits the base's. An adapter written for version 2 that never set it then defining a version-2 prepare
    hook is taken for what it is, a version-2 adapter, not refused."""
    return next((vars(k)["api_version"] for k in cls.__mro__ if k is not Adapter and "api_version" in vars(k)), None)


def effective_api_version(cls: type[Adapter]) -> int:
    """The contract version the core holds the adapter to: the declared one, else 2 for a class that defines a
    version-2 prepare hook without declaring any (written before version 3), else the current one."""
    declared = declared_api_version(cls)
    if declared is not None:
        return int(declared)
    return 2 if legacy_hooks(cls) else ADAPTER_API_VERSION


def _legacy_refusal(cls: type[Adapter]) -> str:
    """Why a version-3 adapter that defines a version-2 prepare hook cannot load."""
    found = legacy_hooks(cls)
    todo = "; ".join(f"`{name}`: {LEGACY_PREPARE_HOOKS[name]}" for name in found)
    return (
        f"{cls.__module__}.{cls.__qualname__} declares adapter API {cls.api_version} but defines {', '.join(found)}, "
        f"which the version-{ADAPTER_API_VERSION} core no longer calls: it drives the prepare walk itself "
        f"(docs/adapters.md, 'Versions of the contract'). Instead: {todo}"
    )


def warn_deprecated_version(cls: type[Adapter]) -> None:
    """A `DeprecationWarning`, once per adapter class, for an adapter built for a version still loading
    for this minor release only (`DEPRECATED_ADAPTER_API_VERSIONS`)."""
    version = effective_api_version(cls)
    if version not in DEPRECATED_ADAPTER_API_VERSIONS or cls in _WARNED_VERSIONS:
        return
    _WARNED_VERSIONS.add(cls)
    warnings.warn(
        f"The {cls.name!r} adapter ({cls.__module__}.{cls.__qualname__}) was built for adapter API "
        f"{version}; this accel-base speaks {ADAPTER_API_VERSION} and loads version {version} for "
        f"this minor release only. docs/adapters.md ('Versions of the contract') says what to change.",
        DeprecationWarning,
        stacklevel=4,
    )


_WARNED_VERSIONS: set[type] = set()


def _removed_hooks(cls: type, base: type, removed: Mapping[str, str]) -> str:
    """Why `cls` cannot load: the removed hooks it (or a class between it and `base`) defines; "" if none."""
    found = [
        name
        for name in removed
        if any(name in vars(k) for k in cls.__mro__ if k is not base and issubclass(k, base))
        and not hasattr(base, name)
    ]
    if not found:
        return ""
    todo = "; ".join(f"`{name}`: {removed[name]}" for name in found)
    return (
        f"{cls.__module__}.{cls.__qualname__} defines {', '.join(found)}, which this accel-base no longer calls "
        f"(docs/adapters.md, 'Versions of the contract'). Move it: {todo}"
    )


@functools.cache
def strategy_records() -> dict[str, PluginRecord]:
    """Every entry point in `accel.strategies`; a strategy class that defines a hook the core no longer
    calls (`REMOVED_STRATEGY_HOOKS`) is recorded with that error instead of loading."""
    records = _load_group(STRATEGY_GROUP)
    from ..strategies.base import REMOVED_STRATEGY_HOOKS, Strategy

    for name, rec in list(records.items()):
        why = (
            _removed_hooks(rec.loaded, Strategy, REMOVED_STRATEGY_HOOKS)
            if rec.ok and isinstance(rec.loaded, type)
            else ""
        )
        if why:
            records[name] = PluginRecord(name=name, value=rec.value, distribution=rec.distribution, error=why)
    if "ddp" not in records or not records["ddp"].ok:
        from ..strategies.ddp import DDPStrategy

        records["ddp"] = PluginRecord(
            name="ddp", value="accel.strategies.ddp:DDPStrategy", distribution="accel-base", loaded=DDPStrategy
        )
    return records


def installed_adapters() -> dict[str, type[Adapter]]:
    """The adapters that loaded, by name."""
    return {name: rec.loaded for name, rec in adapter_records().items() if rec.ok}


def broken_adapters() -> dict[str, str]:
    """Adapters whose entry point failed to load, with the error."""
    return {name: rec.error for name, rec in adapter_records().items() if not rec.ok}


def availability(cls: type[Adapter]) -> Availability:
    try:
        return cls.availability()
    except Exception as exc:  # a probe that raises means "not available", with the reason
        return Availability(available=False, reason=f"availability check raised {type(exc).__name__}: {exc}")


def get_adapter_class(name: str) -> type[Adapter]:
    """The adapter class called `name`; `AdapterNotFoundError` lists the installed ones."""
    records = adapter_records()
    rec = records.get(name)
    if rec is None:
        names = ", ".join(sorted(installed_adapters())) or "none"
        raise AdapterNotFoundError(
            f"No accel adapter named {name!r} is installed. Installed adapters: {names}. "
            f"Install its package (e.g. `pip install accel-{name}`) or pick one of those."
        )
    if not rec.ok:
        raise AdapterNotFoundError(
            f"The accel adapter {name!r} (from {rec.distribution}, {rec.value}) failed to load: {rec.error}"
        )
    return rec.loaded  # type: ignore[no-any-return]


def select_adapter(requested: str | None = None, *, emulate: bool = False) -> type[Adapter]:
    """Choose the adapter class: the one requested, else the best available, else `cpu`.

    A requested adapter that is not available here raises `AdapterUnavailableError`
    with the reason, unless `emulate` is set (emulation runs it on the CPU).
    """
    if requested:
        cls = get_adapter_class(requested)
        if not emulate:
            avail = availability(cls)
            if not avail:
                raise AdapterUnavailableError(
                    f"The accel adapter {requested!r} is installed but cannot run here: {avail.reason}. "
                    "Run on its hardware, or set ACCEL_EMULATE=1 (`accel launch --emulate`) to run it on the CPU."
                )
        warn_deprecated_version(cls)
        return cls
    candidates = [cls for cls in installed_adapters().values() if cls.name != BUILTIN_ADAPTER and availability(cls)]
    chosen = max(candidates, key=lambda c: (c.priority, c.name)) if candidates else get_adapter_class(BUILTIN_ADAPTER)
    _warn_broken(chosen.name)
    warn_deprecated_version(chosen)
    return chosen


_WARNED: set[str] = set()
REPORTED_VARIABLE = BROKEN_ADAPTERS_VARIABLE
"""Set by the process that reported broken adapter plugins (`<pid>:<name>,<name>`): the workers
`accel launch` starts from it inherit it and stay quiet about those plugins."""


def _reported_by_launcher() -> set[str]:
    """The broken plugins this process's launcher already reported (empty unless this is a launched worker)."""
    env = read_env()
    pid, _, names = env.broken_adapters_reported.partition(":")
    # Only a launched worker (LOCAL_RANK set) whose parent made the report: another program started from a
    # process that reported (a test, a user script running `accel launch`) still says it once.
    if not env.launched_worker or not pid.isdigit() or int(pid) != os.getppid():
        return set()
    return {name for name in names.split(",") if name}


def _warn_broken(chosen: str) -> None:
    """Say once per launch that an installed adapter plugin could not load: automatic selection
    skipped it, which would otherwise look like its hardware being absent. Once per process, and
    not in the workers of an `accel launch` that said it already."""
    broken = {name: err for name, err in broken_adapters().items() if name not in _WARNED}
    if not broken:
        return
    _WARNED.update(broken)
    said = _reported_by_launcher()
    os.environ[REPORTED_VARIABLE] = f"{os.getpid()}:{','.join(sorted(_WARNED))}"  # for the workers we start
    broken = {name: err for name, err in broken.items() if name not in said}
    if broken:
        listed = "; ".join(f"{name!r}: {err}" for name, err in sorted(broken.items()))
        # A log record, not a Python warning: one line on stderr (through logging's last-resort
        # handler when nothing is configured), and no effect on code that turns warnings into errors.
        logging.getLogger("accel").warning(
            "accel: installed adapter plugin(s) failed to load and were skipped (%s); using %r. Reinstall or "
            "uninstall the broken package (`accel env` shows every adapter).",
            listed,
            chosen,
        )


def get_strategy_class(name: str) -> type[Any]:
    rec = strategy_records().get(name)
    if rec is None:
        names = ", ".join(sorted(n for n, r in strategy_records().items() if r.ok))
        raise StrategyNotFoundError(f"No accel strategy named {name!r}. Installed strategies: {names}.")
    if not rec.ok:
        raise StrategyNotFoundError(f"The accel strategy {name!r} ({rec.distribution}) failed to load: {rec.error}")
    return rec.loaded


def clear_cache() -> None:
    """Forget loaded entry points (tests that install plugins at run time call this)."""
    adapter_records.cache_clear()
    strategy_records.cache_clear()


def availability_probe(name: str) -> Any:
    """The `is_<hardware>_available` probe Accelerate scripts call, from the installed adapters.

    The core names no hardware: an adapter contributes its probes (`Adapter.availability_probes`,
    e.g. `is_<device>_available`). A probe no installed adapter provides answers
    False, since the hardware cannot be used here. Returns None for names that are not probes.
    """
    if not (name.startswith("is_") and name.endswith("_available") and name[3:-10].isidentifier()):
        return None
    for record in adapter_records().values():
        probe = record.ok and record.loaded.availability_probes().get(name)
        if probe:
            return probe

    def unavailable(*args: Any, **kwargs: Any) -> bool:
        return False

    unavailable.__name__ = name
    unavailable.__doc__ = f"False: no installed accel adapter provides `{name}` (its hardware is not usable here)."
    return unavailable
