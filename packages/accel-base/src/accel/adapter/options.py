"""Adapter options: one typed dataclass per adapter, each field naming its variable, flag and help.

An adapter's settings reach the workers three ways, strongest first: `Accelerator(adapter_options=...)`
from code, `accel launch` flags (turned into environment variables for the workers), and those
variables set by hand. Declare each field once with `option(...)` on an `AdapterOptions` subclass and
the three are generated: `from_env` (variables, then overrides), `add_launch_arguments` (the flags)
and `launch_env` (flags -> variables). Name the class in `Adapter.options_class` and the adapter
parses it into `self.config` at construction.

    @dataclass(kw_only=True, frozen=True)
    class MyOptions(AdapterOptions):
        label: ClassVar[str] = "My"
        fused: bool = option(False, env="ACCEL_MY_FUSED", flag="--my-fused", help="my: fused kernels")

One parsing for every adapter: a variable set to the empty string counts as unset; booleans are
1/true/yes/on or 0/false/no/off (any case); choices match without regard to case; integers are
whole numbers; anything else is refused with the variable's name and what to set it to.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import AccelError
from ..settings.env import read_env

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
_KEY = "accel_option"


class AdapterOptionsError(AccelError, ValueError):
    """An adapter option with a value it cannot take, or an option the adapter does not have."""


@dataclass(frozen=True)
class OptionSpec:
    """Where one option comes from (kept in the field's metadata by `option`)."""

    env: str
    """The environment variable the workers read."""
    flag: str | None = None
    """The `accel launch` flag (None: no flag). Booleans also get `--no-<flag>`."""
    help: str = ""
    """The flag's help text."""
    choices: tuple[str, ...] | None = None
    """The values a string option takes (matched without regard to case)."""
    none_word: str = "auto"
    """For an optional boolean: the word for None ("let the adapter decide")."""
    minimum: int | None = None
    """For an integer: the smallest value accepted."""


def option(
    default: Any,
    *,
    env: str,
    flag: str | None = None,
    help: str = "",
    choices: tuple[str, ...] | None = None,
    none_word: str = "auto",
    minimum: int | None = None,
) -> Any:
    """A field of an `AdapterOptions` dataclass, with its variable, launch flag and help.

    The field's annotation says how values parse: `bool`, `int`, `float` or `str`, optionally
    `| None` (None is then accepted; for a boolean the variable's `none_word` means None).
    """
    spec = OptionSpec(env=env, flag=flag, help=help, choices=choices, none_word=none_word, minimum=minimum)
    return dataclasses.field(default=default, metadata={_KEY: spec})


@dataclass(frozen=True)
class _Field:
    name: str
    spec: OptionSpec
    kind: type
    optional: bool

    @property
    def dest(self) -> str:
        assert self.spec.flag is not None
        return self.spec.flag.lstrip("-").replace("-", "_")

    def source(self) -> str:
        return f"from {self.spec.flag} or {self.spec.env}" if self.spec.flag else f"from {self.spec.env}"


class AdapterOptions:
    """Base of adapter option dataclasses (`@dataclass(kw_only=True, frozen=True)` subclasses whose
    fields are made with `option`). Values are checked at construction, whatever their source; a
    subclass adds rules between fields in `__post_init__` (calling `super().__post_init__()`)."""

    label: ClassVar[str] = "this"
    """The adapter's name in messages ("Unknown <label> adapter option(s) ...")."""

    def __post_init__(self) -> None:
        for f in _fields(type(self)):
            value = getattr(self, f.name)
            checked = _check(f, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Any:
        """The options from the variables in `env` (default: this process's, now); `overrides` (field name ->
        value, e.g. `Accelerator(adapter_options=...)`) win.

        Raises:
            AdapterOptionsError: a variable that does not parse, a value the option cannot take, or an
                override naming no option (the message lists the options).
        """
        env = read_env().variables if env is None else env
        known = sorted(f.name for f in _fields(cls))
        unknown = sorted(set(overrides or {}) - set(known))
        if unknown:
            raise AdapterOptionsError(f"Unknown {cls.label} adapter option(s) {unknown}; the options are {known}.")
        values: dict[str, Any] = {}
        for f in _fields(cls):
            raw = env.get(f.spec.env)
            if raw is not None and raw.strip():
                values[f.name] = _parse(f, raw)
        values.update(overrides or {})
        return cls(**values)

    @classmethod
    def add_launch_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add one `accel launch` flag per option that names one (default None: not given)."""
        for f in _fields(cls):
            if f.spec.flag is None:
                continue
            kwargs: dict[str, Any] = {"dest": f.dest, "default": None, "help": f.spec.help}
            if f.kind is bool and f.optional:
                kwargs.update(choices=(f.spec.none_word, "on", "off"), type=str.lower)
            elif f.kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif f.spec.choices:
                kwargs.update(choices=f.spec.choices, type=functools.partial(_canonical, f.spec.choices))
            else:
                kwargs["type"] = f.kind
            group.add_argument(f.spec.flag, **kwargs)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        """The variables for the workers from the flags that were given (none for the others).

        Raises:
            AdapterOptionsError: the given flags make options the adapter refuses.
        """
        given: dict[str, Any] = {}
        for f in _fields(cls):
            value = getattr(args, f.dest, None) if f.spec.flag else None
            if value is not None:
                given[f.name] = (
                    {f.spec.none_word: None, "on": True, "off": False}[value]
                    if f.optional and f.kind is bool
                    else value
                )
        checked = cls(**given)
        return {f.spec.env: _word(f, getattr(checked, f.name)) for f in _fields(cls) if f.name in given}


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """The options of `cls` (read once per class)."""
    if cls not in _FIELDS:
        _FIELDS[cls] = _read_fields(cls)
    return _FIELDS[cls]


def _read_fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is None:
            continue
        args = typing.get_args(hints[f.name]) if isinstance(hints[f.name], types.UnionType) else (hints[f.name],)
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
            raise TypeError(f"{cls.__name__}.{f.name}: an option is bool, int, float or str (or one of them | None).")
        out.append(_Field(f.name, spec, kinds[0], len(kinds) < len(args)))
    return tuple(out)


def _canonical(choices: tuple[str, ...], value: str) -> str:
    """`value` spelled as in `choices` when it matches one without regard to case, else unchanged."""
    folded = {c.lower(): c for c in choices}
    return folded.get(value.strip().lower(), value)


def _parse(f: _Field, raw: str) -> Any:
    word = raw.strip()
    if f.kind is bool:
        low = word.lower()
        if f.optional and low == f.spec.none_word:
            return None
        if low in TRUE_WORDS or low in FALSE_WORDS:
            return low in TRUE_WORDS
        words = f"{f.spec.none_word}, 1 or 0" if f.optional else "1 or 0"
        raise AdapterOptionsError(f"{f.spec.env}={raw!r} is not a boolean; set it to {words}.")
    if f.kind in (int, float):
        try:
            return f.kind(word)
        except ValueError:
            what = "a whole number" if f.kind is int else "a number"
            raise AdapterOptionsError(f"{f.spec.env}={raw!r} is not {what}; set it to {what}.") from None
    return word


def _check(f: _Field, value: Any) -> Any:
    """`value` if `f` can take it (a choice respelled as declared), else a clear error."""
    if value is None:
        if f.optional:
            return value
        raise AdapterOptionsError(f"{f.name} must be set, got None ({f.source()}).")
    if f.spec.choices:
        value = _canonical(f.spec.choices, value) if isinstance(value, str) else value
        if value not in f.spec.choices:
            raise AdapterOptionsError(f"{f.name} must be one of {f.spec.choices}, got {value!r} ({f.source()}).")
        return value
    wrong_type = not isinstance(value, f.kind) or (f.kind is not bool and isinstance(value, bool))
    if f.kind is float and isinstance(value, int) and not isinstance(value, bool):
        wrong_type = False
    if wrong_type:
        what = {bool: "True or False", int: "a whole number", float: "a number", str: "a string"}[f.kind]
        raise AdapterOptionsError(f"{f.name} must be {what}, got {value!r} ({f.source()}).")
    if f.spec.minimum is not None and value < f.spec.minimum:
        raise AdapterOptionsError(f"{f.name} must be at least {f.spec.minimum}, got {value!r} ({f.source()}).")
    return value


def _word(f: _Field, value: Any) -> str:
    if value is None:
        return f.spec.none_word
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


__all__ = ["AdapterOptions", "AdapterOptionsError", "OptionSpec", "option"]
