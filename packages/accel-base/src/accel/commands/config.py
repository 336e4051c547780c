"""`accel config`: write, show and update accel's config file; read any config file for `accel launch`.

accel config                 questions on a terminal (flags answer them; no terminal: defaults)
accel config default         write the defaults without asking (like `accelerate config default`)
accel config show            the file `accel launch` would read, validated
accel config update --KEY V  change keys of an existing accel config file
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..compat.config_file import accelerate_launch_defaults
from ..settings.config_file import (
    PRECISIONS,
    RDZV_BACKENDS,
    AccelConfig,
    ConfigError,
    default_config_path,
    field_docs,
    is_accelerate_file,
    json_schema,
    load_accel_config,
    read_yaml,
    save_accel_config,
)
from . import CliParser, UsageError, add_flag

ACTIONS = ("default", "show", "update", "schema")


def _kind(f: dataclasses.Field[Any]) -> str:
    return str(f.type).split(" |")[0]


def _parse_value(kind: str, text: str) -> Any:
    if text.lower() in ("none", "null") and kind != "str":
        return None
    if kind == "bool":
        if text.lower() in ("1", "true", "yes", "y", "on"):
            return True
        if text.lower() in ("0", "false", "no", "n", "off"):
            return False
        raise ValueError("expected yes or no")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind.startswith("dict"):
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object")
        return value
    return text or None


def config_parser(prog: str = "accel config") -> argparse.ArgumentParser:
    """The `accel config` parser: an optional action and one flag per config key."""
    p = CliParser(prog=prog, description="Write, show or update accel's config file.")
    p.add_argument("action", nargs="?", choices=ACTIONS, help="default, show, update or schema (none: ask questions)")
    add_flag(p, "config-file", default=None, help=f"the file (default: ACCEL_CONFIG_FILE, else {_shown_default()})")
    p.add_argument("--force", action="store_true", help="`default`: overwrite an existing file")
    keys = p.add_argument_group("keys (each a field of accel.settings.config_file.AccelConfig)")
    for f in dataclasses.fields(AccelConfig):
        add_flag(keys, f.name, default=None, metavar=_kind(f).split("[")[0].upper(), help=field_docs().get(f.name))
    return p


def _shown_default() -> str:
    return "~/.cache/accel/default_config.yaml"


def _given(ns: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(AccelConfig):
        text = getattr(ns, f.name)
        if text is None:
            continue
        try:
            out[f.name] = _parse_value(_kind(f), text)
        except ValueError as exc:
            raise UsageError(f"--{f.name.replace('_', '-')}: {exc} (got {text!r})") from None
    return out


def _choices(name: str, kind: str) -> list[str]:
    """The answers a question accepts, shown with it (empty: free text)."""
    from ..adapter import registry

    if name == "mixed_precision":
        return list(PRECISIONS)
    if name == "rdzv_backend":
        return list(RDZV_BACKENDS)
    if name == "adapter":
        return sorted(registry.installed_adapters())
    if name == "strategy":
        return sorted(n for n, r in registry.strategy_records().items() if r.ok)
    if kind == "bool":
        return ["yes", "no"]
    return []


def _ask(config: AccelConfig, skip: set[str]) -> AccelConfig:
    """Plain prompts, one per key, each showing its choices; Enter keeps the value shown in brackets.

    Each answer is checked as it is given (alone, then with the answers before it): a bad one is said
    in one line and asked again, so no answer is lost to another's mistake.
    """
    values = dataclasses.asdict(config)
    for f in dataclasses.fields(AccelConfig):
        if f.name in skip:
            continue
        choices = _choices(f.name, _kind(f))
        listed = f" ({'/'.join(choices)})" if choices else ""
        while True:
            current = values[f.name]
            shown = json.dumps(current) if isinstance(current, dict) else current
            answer = input(f"{field_docs().get(f.name, f.name)}\n  {f.name}{listed} [{shown}]: ").strip()
            if not answer:
                break
            try:
                candidate = {**values, f.name: _parse_value(_kind(f), answer)}
                AccelConfig(**candidate).validate()
            except ConfigError as exc:
                if str(exc).startswith(f"{f.name}:"):  # this answer is wrong, not a later key's default
                    print(f"  {exc}; try again", file=sys.stderr)
                    continue
            except ValueError as exc:
                print(f"  {exc}; try again", file=sys.stderr)
                continue
            values = candidate
            break
    return AccelConfig(**values)


def config_command(argv: Sequence[str]) -> int:
    """Run `accel config ARGV`; the exit code."""
    ns = config_parser().parse_args(list(argv))
    path = Path(ns.config_file).expanduser() if ns.config_file else default_config_path()
    given = _given(ns)
    if ns.action == "show":
        print(show(path))
        return 0
    if ns.action == "schema":
        print(json.dumps(json_schema(), indent=1))
        return 0
    if ns.action == "update":
        if not path.is_file():
            raise UsageError(f"no config file at {path}: write one with `accel config` or `accel config default`")
        data, _ = read_yaml(path)
        if is_accelerate_file(data):
            raise UsageError(f"{path} is Accelerate's; `accel launch --config_file {path}` reads it as it is")
        config = dataclasses.replace(load_accel_config(path), **given)
    elif ns.action == "default":
        if path.exists() and not ns.force:
            print(f"accel config: {path} exists; not overwritten (use `accel config update`, or --force)")
            return 1
        config = AccelConfig(**given)
    else:
        config = AccelConfig(**given)
        if sys.stdin.isatty():
            config = _ask(config, skip=set(given))
    save_accel_config(config, path)
    print(f"accel config saved at {path}")
    return 0


def show(path: Path) -> str:
    """The file at `path` and what `accel launch` takes from it, or why it is unusable."""
    if not path.is_file():
        return f"no config file at {path} (accel launch uses its built-in defaults)"
    data, lines = read_yaml(path)
    if is_accelerate_file(data):
        values, notes = accelerate_launch_defaults(data, lines)
        kind = "Accelerate config file"
    else:
        values, notes = load_accel_config(path).to_launch_defaults(), []
        kind = "accel config file"
    values = set_in_file(values)
    out = [f"{kind}: {path}", "accel launch takes:"]
    out += [f"  {key}: {json.dumps(value)}" for key, value in sorted(values.items())]
    out += [f"note: {note}" for note in notes]
    return "\n".join(out)


UNSET_FILE_VALUES: dict[str, Any] = {"mixed_precision": "no", "gradient_accumulation_steps": 1, "dynamo_backend": "no"}
"""File values that only restate the built-in default (`accel config` writes them when Enter is pressed): not
"set", so `accel launch` neither exports them nor lets them override the script's `Accelerator(...)` arguments."""


def set_in_file(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less those that restate a default (`UNSET_FILE_VALUES`, and `strategy: ddp` with no settings)."""
    out = {k: v for k, v in values.items() if k not in UNSET_FILE_VALUES or v != UNSET_FILE_VALUES[k]}
    if out.get("strategy") == "ddp" and not out.get("strategy_kwargs"):
        del out["strategy"]
    return out


def accelerate_default_config_path() -> Path:
    """Where Accelerate keeps its default config: `ACCELERATE_CONFIG_FILE`, else
    `$HF_HOME/accelerate/default_config.yaml` (HF_HOME: `$XDG_CACHE_HOME/huggingface`, else ~/.cache/huggingface)."""
    named = os.environ.get("ACCELERATE_CONFIG_FILE")
    if named:
        return Path(named).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    hf_home = os.environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    return Path(hf_home).expanduser() / "accelerate" / "default_config.yaml"


def find_config_file(config_file: str | None) -> tuple[Path | None, str]:
    """The config file `accel launch` reads and where it came from, in words: `--config_file`, else
    `ACCEL_CONFIG_FILE`, else accel's default file, else Accelerate's (`accelerate_default_config_path`).
    (None, "built-in defaults") when there is none.

    Raises:
        ConfigError: a file named by `--config_file`, `ACCEL_CONFIG_FILE` or `ACCELERATE_CONFIG_FILE` is missing.
    """
    if config_file:
        path = Path(config_file).expanduser()
        if not path.is_file():
            raise ConfigError(f"the config file {path} does not exist")
        return path, f"config {path}"
    path = default_config_path()
    if path.is_file():
        return path, f"config {path}"
    if os.environ.get("ACCEL_CONFIG_FILE"):
        raise ConfigError(f"ACCEL_CONFIG_FILE={path} does not exist; unset it or write it with `accel config`")
    theirs = accelerate_default_config_path()
    if theirs.is_file():
        return theirs, f"Accelerate's config {theirs}"
    if os.environ.get("ACCELERATE_CONFIG_FILE"):
        raise ConfigError(f"ACCELERATE_CONFIG_FILE={theirs} does not exist; unset it or point it at a config file")
    return None, "no config file"


def launch_defaults_from_file(config_file: str | None, path: Path | None = None) -> dict[str, Any]:
    """`accel launch` defaults from `config_file` (or `path`, already found), else the file `find_config_file`
    finds; values that restate a default are left out (`set_in_file`).

    Raises:
        ConfigError: the file is missing (when named), unreadable, or has a key accel refuses.
    """
    if path is None:
        path = find_config_file(config_file)[0]
        if path is None:
            return {}
    data, lines = read_yaml(path)
    if not is_accelerate_file(data):
        return set_in_file(load_accel_config(path).to_launch_defaults())
    values, notes = accelerate_launch_defaults(data, lines)
    for note in notes:
        print(f"accel launch: {path}: {note}", file=sys.stderr)
    return set_in_file(values)
