"""Environment-variable helpers of Accelerate's `utils` (re-exported by `accel.utils`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1/0 (or True/False with `to_bool`) for y/yes/t/true/on/1 and n/no/f/false/off/0.

    Raises:
        ValueError: any other string.
    """
    value = value.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True if to_bool else 1
    if value in ("n", "no", "f", "false", "off", "0"):
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first non-negative integer among the variables `env_keys`, else `default`."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether the variable `key` is set to a true value (`str_to_bool`), else `default`."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The value of `key`, else `default`."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of `library_names` already imported in this process."""
    return [name for name in library_names if name in sys.modules]


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """`KEY=value\\n` lines for the items that are safe in an env file (others skipped with a warning)."""
    forbidden = (";", "\n", "<", ">", " ")
    lines = []
    for key, value in current_env.items():
        if key and value and not any(c in key + value for c in forbidden):
            lines.append(f"{key}={value}\n")
        else:
            warnings.warn(f"Skipping {key}={value}: it contains forbidden characters or is empty.", stacklevel=2)
    return lines


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty `os.environ`; the previous environment comes back afterwards."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each keyword (upper-cased) as an environment variable inside the block, then restore."""
    saved: dict[str, str | None] = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


_PREFIXES = ("ACCELERATE_", "ACCEL_")


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: variables starting with ACCELERATE_/ACCEL_ that the function (or each test method of
    the class) sets are removed again when it returns."""

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = {k: v for k, v in os.environ.items() if k.startswith(_PREFIXES)}
            try:
                return fn(*args, **kwargs)
            finally:
                for key in [k for k in os.environ if k.startswith(_PREFIXES)]:
                    if key not in before:
                        del os.environ[key]
                os.environ.update(before)

        return wrapper

    if inspect.isclass(func_or_cls):
        for name, member in list(vars(func_or_cls).items()):
            if name.startswith("test") and callable(member):
                setattr(func_or_cls, name, wrap(member))
        return func_or_cls
    return wrap(func_or_cls)


__all__ = [
    "are_libraries_initialized",
    "clear_environment",
    "convert_dict_to_env_variables",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]
