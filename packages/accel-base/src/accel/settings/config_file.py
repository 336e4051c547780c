"""accel's config file: a typed, validated YAML file that `accel launch` reads for its defaults.

Location: `--config-file PATH`, else `ACCEL_CONFIG_FILE`, else `default_config.yaml` in
accel's cache folder (`$XDG_CACHE_HOME/accel`, else `~/.cache/accel`). `accel config`
writes it. A file written by Accelerate (`accelerate config`; it has a `distributed_type`)
is read as Accelerate's and mapped key by key (`accelerate_config.py`).

Errors name the file, the line and the key (`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AccelError, SettingError
from .env import read_env
from .launch import check_host

PRECISIONS = ("no", "bf16", "fp16", "fp8")
_PHRASES = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "dict[str, Any]": "a mapping",
}


class ConfigError(AccelError, ValueError):
    """A config file cannot be read, or one of its keys is unknown or has a bad value."""


@dataclass(kw_only=True)
class AccelConfig:
    """Defaults for `accel launch`; a flag on the command line always wins over the file."""

    adapter: str | None = None
    """Hardware adapter (`accel env` lists them); None picks the best available."""
    emulate: bool = False
    """Run the adapter's code on the CPU with gloo (debug a hardware script on a laptop)."""
    num_processes: int | None = None
    """Processes per node; None: one per device the adapter sees (1 on CPU)."""
    num_machines: int = 1
    """Nodes in the job; `accel launch` runs once on each."""
    machine_rank: int = 0
    """This node's rank (0 hosts the rendezvous)."""
    main_process_ip: str | None = None
    """Address of node 0 (several nodes)."""
    main_process_port: int | None = None
    """Rendezvous port on node 0; None: torchrun picks a free one on a single node, 29500 otherwise."""
    rdzv_backend: str | None = None
    """torchrun's rendezvous backend ("c10d" or "static"); None: static, or c10d with an endpoint."""
    mixed_precision: str = "no"
    """"no", "bf16", "fp16" or "fp8" (adapters that support it)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step under `accelerator.accumulate`."""
    strategy: str = "ddp"
    """How work is spread: "ddp", "fsdp2", "deepspeed", or another registered strategy."""
    strategy_config: dict[str, Any] = field(default_factory=dict)
    """Fields of the strategy's config class (`FSDPConfig`, `DeepSpeedPlugin`, ...)."""
    dynamo_backend: str = "no"
    """`torch.compile` backend, or "no"."""
    debug: bool = False
    """Check shapes and dtypes across ranks in every collective (slower; finds mismatches)."""
    timeout: float | None = None
    """Collective timeout in seconds; None: 30 minutes."""
    num_cpu_threads_per_process: int | None = None
    """OMP_NUM_THREADS of each process; None: cores / processes for several CPU processes."""

    def validate(self, where: dict[str, str] | None = None) -> None:
        """Check every value; `where` maps a key to "FILE:LINE" for the message.

        Raises:
            ConfigError: naming the key (and its line) and what it accepts.
        """
        where = where or {}

        def bad(key: str, accepts: str) -> ConfigError:
            at = f"{where[key]}: " if key in where else ""
            return ConfigError(f"{at}{key}: expected {accepts}, got {getattr(self, key)!r}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and "None" in str(f.type):
                continue
            kind = str(f.type).split(" |")[0]
            ok = {
                "bool": isinstance(value, bool),
                "int": isinstance(value, int) and not isinstance(value, bool),
                "float": isinstance(value, (int, float)) and not isinstance(value, bool),
                "str": isinstance(value, str),
                "dict[str, Any]": isinstance(value, dict),
            }[kind]
            if not ok:
                raise bad(f.name, _PHRASES[kind])
        if self.mixed_precision not in PRECISIONS:
            raise bad("mixed_precision", " or ".join(PRECISIONS))
        for key in ("num_processes", "num_machines", "gradient_accumulation_steps", "num_cpu_threads_per_process"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise bad(key, "an integer >= 1")
        if not 0 <= self.machine_rank < self.num_machines:
            raise bad("machine_rank", f"0 <= machine_rank < num_machines ({self.num_machines})")
        if self.timeout is not None and self.timeout <= 0:
            raise bad("timeout", "a positive number of seconds")
        if self.main_process_port is not None and not 1 <= self.main_process_port <= 65535:
            raise bad("main_process_port", "a port number from 1 to 65535")
        if self.main_process_ip is not None:
            try:
                check_host("main_process_ip", self.main_process_ip)
            except SettingError:
                raise bad("main_process_ip", "a host name or an IP address of the main node") from None
        self._validate_names(where)

    def _validate_names(self, where: dict[str, str]) -> None:
        """The adapter and strategy are installed, and `strategy_config` holds fields of the strategy's
        config class with values it accepts (checked here, not first in every worker)."""
        from ..adapter import registry
        from ..errors import AccelError

        def at(key: str) -> str:
            return f"{where[key]}: " if key in where else ""

        adapters = registry.installed_adapters()
        if self.adapter is not None and self.adapter not in adapters:
            raise ConfigError(
                f"{at('adapter')}adapter: no installed adapter is named {self.adapter!r}; installed: "
                f"{', '.join(sorted(adapters))} (`accel env` shows them; install the adapter's package)"
            )
        strategies = sorted(n for n, r in registry.strategy_records().items() if r.ok)
        if self.strategy not in strategies:
            raise ConfigError(
                f"{at('strategy')}strategy: no accel strategy is named {self.strategy!r}; installed: "
                f"{', '.join(strategies)}"
            )
        if not self.strategy_config:
            return
        from .strategy_config import strategy_config_class, strategy_config_from_json

        cls = strategy_config_class(self.strategy)
        if cls is not None and dataclasses.is_dataclass(cls):
            fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
            for key in self.strategy_config:
                if key not in fields:
                    raise ConfigError(
                        f"{at('strategy_config.' + str(key)) or at('strategy_config')}strategy_config.{key}: "
                        f"not a field of {cls.__name__} (the {self.strategy} strategy's config); its fields: "
                        f"{', '.join(fields)}"
                    )
        try:
            strategy_config_from_json(self.strategy, json.dumps(self.strategy_config))
        except (TypeError, ValueError, AccelError) as exc:
            text = str(exc)
            # The config class names the field it refused: point at that field's line.
            refused = next((str(k) for k in self.strategy_config if text.startswith(str(k)) or f"'{k}'" in text), None)
            where_key = f"strategy_config.{refused}" if refused else "strategy_config"
            raise ConfigError(f"{at(where_key) or at('strategy_config')}{where_key}: {text}") from None

    def to_launch_defaults(self) -> dict[str, Any]:
        """`accel launch` destinations and values (see `launch.resolve`)."""
        out: dict[str, Any] = {
            "adapter": self.adapter,
            "emulate": self.emulate,
            "num_processes": self.num_processes,
            "nnodes": str(self.num_machines),
            "node_rank": self.machine_rank if self.num_machines > 1 else None,
            "master_addr": self.main_process_ip,
            "master_port": self.main_process_port,
            "rdzv_backend": self.rdzv_backend,
            "mixed_precision": self.mixed_precision,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "strategy": self.strategy,
            "dynamo_backend": self.dynamo_backend,
            "debug": self.debug,
            "timeout": self.timeout,
            "num_cpu_threads_per_process": self.num_cpu_threads_per_process,
            "strategy_kwargs": dict(self.strategy_config),
        }
        return {k: v for k, v in out.items() if v is not None}


def json_schema() -> dict[str, Any]:
    """A JSON Schema of the config file (for editors and validators), from the dataclass itself."""
    types = {"bool": "boolean", "int": "integer", "float": "number", "str": "string", "dict[str, Any]": "object"}
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(AccelConfig):
        kind = types[str(f.type).split(" |")[0]]
        entry: dict[str, Any] = {"type": [kind, "null"] if "None" in str(f.type) else kind}
        entry["description"] = field_docs().get(f.name, "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        entry["default"] = default
        if f.name == "mixed_precision":
            entry["enum"] = list(PRECISIONS)
        properties[f.name] = entry
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "accel config file",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }


def default_config_path() -> Path:
    """Where `accel config` writes and `accel launch` looks: `ACCEL_CONFIG_FILE`, else the cache folder."""
    env = read_env()
    if env.config_file:
        return Path(env.config_file).expanduser()
    cache = env.cache_home or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "accel" / "default_config.yaml"


MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this (1 MiB) is refused unread: no real one comes near it."""
MAX_CONFIG_DEPTH = 32
"""Mappings and lists nested deeper than this are refused (PyYAML would recurse once per level)."""
MAX_CONFIG_NODES = 100_000
"""Values a config file may hold once its aliases are expanded (an alias bomb expands to billions)."""


def read_yaml(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The file's top-level mapping and, for each key, "FILE:LINE".

    The text must be UTF-8, at most `MAX_CONFIG_BYTES`, nested at most `MAX_CONFIG_DEPTH` deep and hold at
    most `MAX_CONFIG_NODES` values with its aliases expanded; these are checked on the parser's event stream,
    before anything is built.

    Raises:
        ConfigError: missing file, not UTF-8, too large, too deep, too many values, invalid YAML, or not a
            mapping at the top; one line naming the file.
    """
    import yaml  # type: ignore[import-untyped]

    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB; a config file holds a few keys")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save the file as UTF-8"
        ) from None
    try:
        _check_shape(yaml.parse(text, Loader=yaml.SafeLoader), path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{at}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file holds a mapping of keys to values, got {type(data).__name__}")
    lines: dict[str, str] = {}
    for key, value in node.value if node is not None else ():
        lines[str(key.value)] = f"{path}:{key.start_mark.line + 1}"
        if isinstance(value, yaml.MappingNode):  # one level down: `fsdp_config.fsdp_version`
            for sub, _ in value.value:
                lines[f"{key.value}.{sub.value}"] = f"{path}:{sub.start_mark.line + 1}"
    return data, lines


def _check_shape(events: Any, path: Path) -> None:
    """Refuse a document nested deeper than `MAX_CONFIG_DEPTH` or holding more than `MAX_CONFIG_NODES` values
    once its aliases are expanded, from the parser's events (an iterative parser: no recursion, nothing built)."""
    import yaml

    sizes: dict[str, int] = {}  # anchor -> values under it, expanded
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, values so far) of each mapping/list being read
    total = 0
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if len(open_nodes) >= MAX_CONFIG_DEPTH:
                raise ConfigError(
                    f"{path}:{event.start_mark.line + 1}: nested more than {MAX_CONFIG_DEPTH} levels deep; "
                    "a config file holds a few levels of keys"
                )
            open_nodes.append((event.anchor, 1))
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, size = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, size = None, sizes.get(event.anchor, 1)
        else:
            continue
        if anchor is not None:
            sizes[anchor] = size
        if open_nodes:
            parent_anchor, parent_size = open_nodes[-1]
            open_nodes[-1] = (parent_anchor, parent_size + size)
        else:
            total += size
        if size > MAX_CONFIG_NODES or total > MAX_CONFIG_NODES:
            raise ConfigError(
                f"{path}:{event.start_mark.line + 1}: holds more than {MAX_CONFIG_NODES} values once its aliases "
                "(*name) are expanded; write the values out, or remove the aliases"
            )


def is_accelerate_file(data: dict[str, Any]) -> bool:
    """Files written by `accelerate config` always carry `distributed_type`."""
    return "distributed_type" in data or "compute_environment" in data


def load_accel_config(path: Path) -> AccelConfig:
    """Read and validate an accel config file.

    Raises:
        ConfigError: unknown key or bad value, naming the line.
    """
    data, lines = read_yaml(path)
    known = {f.name for f in dataclasses.fields(AccelConfig)}
    for key in data:
        if key not in known:
            raise ConfigError(
                f"{lines.get(str(key), path)}: unknown key {key!r}; accel config files take {', '.join(sorted(known))}"
            )
    config = AccelConfig(**data)
    config.validate(lines)
    return config


def save_accel_config(config: AccelConfig, path: Path) -> Path:
    """Write `config` as YAML (keys in field order, each preceded by its description)."""
    import yaml  # type: ignore[import-untyped]

    config.validate()
    path.parent.mkdir(parents=True, exist_ok=True)
    out = ["# accel config file (accel config show/update; docs/cli.md). Flags of `accel launch` win over it."]
    for f in dataclasses.fields(config):
        doc = field_docs().get(f.name, "")
        if doc:
            out.append(f"# {doc}")
        out.append(yaml.safe_dump({f.name: getattr(config, f.name)}, sort_keys=False).rstrip())
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


@functools.cache
def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it in this file's source)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(AccelConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, after in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())  # type: ignore[union-attr]
    return docs


def write_basic_config(mixed_precision: str = "no", save_location: str | os.PathLike[str] | None = None) -> Path | bool:
    """Write a default config file without asking, as Accelerate's `write_basic_config` does (the code form of
    `accel config default`).

    The file holds `mixed_precision` and otherwise accel's defaults: `accel launch` then starts one process per
    device of the adapter it finds (one on a CPU-only machine), the choice Accelerate writes out by hand.
    `save_location` defaults to where `accel launch` looks (`ACCEL_CONFIG_FILE`, else
    `~/.cache/accel/default_config.yaml`); pass another path to `accel launch --config_file`.

    Returns:
        The path written, or False when a file is already there (it is never overwritten; a message says so).

    Raises:
        ValueError: `mixed_precision` is not "no", "fp16", "bf16" or "fp8" (Accelerate's message).
    """
    path = Path(save_location).expanduser() if save_location is not None else default_config_path()
    if path.exists():
        print(
            f"Configuration already exists at {path}, will not override. Run `accel config` manually or pass a "
            "different `save_location`."
        )
        return False
    mode = str(mixed_precision).lower()
    if mode not in PRECISIONS:
        raise ValueError(
            f"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8'. Received {mixed_precision}"
        )
    return save_accel_config(AccelConfig(mixed_precision=mode), path)
