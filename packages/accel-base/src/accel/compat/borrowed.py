"""Accelerate's stateless helpers, borrowed under the `accelerate` alias when Accelerate is installed.

transformers, peft and trl import Accelerate internals accel has no counterpart for: device-map
arithmetic (`utils.modeling.clean_device_map`), big-model dispatch and its forward hooks
(`hooks.add_hook_to_module`, `AlignDevicesHook`), constants (`utils.constants.FSDP_SHARDING_STRATEGY`),
the parsed DeepSpeed config (`utils.deepspeed.HfDeepSpeedConfig`), readers of Accelerate's config file.
None of these holds process state. Under `accel.as_accelerate`, when accel does not provide a name
(or provides only a stand-in that raises on use), and the name's home in the installed Accelerate is
one of `HELPER_MODULES`, the name is the real Accelerate's object.

The real module is executed under its own name (`accelerate.utils.modeling`), so every import it
makes goes through the alias again: `from ..state import AcceleratorState` gives accel's state. A
module that owns state, data, checkpoints, parallelism or trackers (`accelerate.state`,
`accelerator`, `data_loader`, ...) is never on the list and is never executed: there is one
`AcceleratorState` in the process, accel's.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HELPER_MODULES: dict[str, str] = {
    "big_modeling": "big-model inference: empty-weight init, device-map dispatch, CPU/disk offload",
    "hooks": "the forward hooks big-model dispatch attaches to modules",
    "utils.modeling": "device-map and module-size arithmetic, tied-parameter bookkeeping",
    "utils.offload": "offloaded weights on disk",
    "utils.constants": "Accelerate's constant names and values",
    "utils.dataclasses": "enums and helpers accel has no counterpart for (CustomDtype, get_module_class_from_name)",
    "utils.deepspeed": "HfDeepSpeedConfig (a parsed DeepSpeed config) and DeepSpeedSchedulerWrapper",
    "utils.imports": "availability probes of libraries accel has no adapter answer for",
    "utils.environment": "environment and interconnect probes accel has no adapter answer for",
    "utils.versions": "version comparisons",
    "utils.other": "small module helpers (recursive_getattr, ...)",
    "utils.memory": "memory helpers accel lacks",
    "utils.tqdm": "the tqdm wrapper",
    "commands.config": "reading Accelerate's config file (default_config_file, load_config_from_file)",
}
"""Accelerate modules (relative to `accelerate`) whose names may be borrowed, with what they hold.
A module and its submodules; nothing else of Accelerate is ever executed under the alias."""

HELPER_NAMES: dict[str, frozenset[str]] = {
    "utils.fsdp_utils": frozenset({"get_parameters_from_modules", "get_module_children_bottom_up"}),
}
"""Modules of which only some names are helpers: the rest is accel's concern (saving and loading FSDP
checkpoints: accel's own `save_fsdp_model`, ..., in `accel.strategies.fsdp_files`) or a stand-in that says why not."""

_LOADED: dict[str, ModuleType] = {}


class _Nothing:
    """Marks that no helper was found (None is a legitimate attribute value)."""


NOTHING = _Nothing()


SHIM_DIR = Path(__file__).parent / "_accelerate_shim"
"""Directory holding the `accelerate` package that installs the alias; put it first on PYTHONPATH."""


def real_accelerate_dir() -> Path | None:
    """Where the real `accelerate` package is installed (None if it is not)."""
    shim = str(SHIM_DIR.resolve())
    paths = [p for p in sys.path if p and Path(p).resolve().as_posix() != shim]
    spec = importlib.machinery.PathFinder.find_spec("accelerate", paths)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def is_helper(module: str, name: str) -> bool:
    """Whether `module.name` (`module` as `accelerate.x.y`, where Accelerate defines the name) may be borrowed."""
    rest = module.removeprefix("accelerate").lstrip(".")
    if name in HELPER_NAMES.get(rest, ()):
        return True
    return any(rest == h or rest.startswith(h + ".") for h in HELPER_MODULES)


def _source(root: Path, module: str) -> Path | None:
    """The file of `module` (`accelerate.x.y`) in the real package rooted at `root`."""
    path = root.joinpath(*module.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _reexports(init: Path) -> dict[str, tuple[str, str]]:
    """`name -> (relative module, original name)` for every `from .x import name` in a package's __init__."""
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            for alias in node.names:
                found.setdefault(alias.asname or alias.name, (node.module, alias.name))
    return found


def home_of(module: str, name: str) -> tuple[str, str] | None:
    """Where Accelerate defines `module.name`: `(defining module, name there)`, following a package's
    re-exports (`accelerate.utils.DeepSpeedSchedulerWrapper` -> `accelerate.utils.deepspeed`). None when
    Accelerate is not installed or has no such module."""
    root = real_accelerate_dir()
    if root is None:
        return None
    for _ in range(4):  # accelerate -> utils -> utils.x: re-exports are at most a few levels deep
        source = _source(root, module)
        if source is None:
            return None
        if source.name != "__init__.py":
            return module, name
        target = _reexports(source).get(name)
        if target is None:
            return module, name
        module, name = f"{module}.{target[0]}", target[1]
    return module, name


def _load(module: str, root: Path) -> ModuleType:
    """Execute the real Accelerate's `module` (once) under its own name, outside `sys.modules`: the name
    there is the alias's view, which hands out this module's attributes."""
    if module in _LOADED:
        return _LOADED[module]
    source = _source(root, module)
    spec = importlib.util.spec_from_file_location(
        module,
        source,
        submodule_search_locations=[str(source.parent)] if source and source.name == "__init__.py" else None,
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load Accelerate's `{module}` from {source}", name=module)
    loaded = importlib.util.module_from_spec(spec)
    _LOADED[module] = loaded  # before executing: an import circle sees the half-built module, as Python's own does
    try:
        spec.loader.exec_module(loaded)
    except BaseException:
        del _LOADED[module]
        raise
    return loaded


def borrow(module: str, name: str) -> Any:
    """The real Accelerate's `module.name` if Accelerate is installed and its home is a helper module;
    `NOTHING` otherwise (the caller then raises its own error)."""
    if name.startswith("__"):
        return NOTHING
    home = home_of(module, name)
    root = real_accelerate_dir()
    if home is None or root is None or not is_helper(home[0], home[1]):
        return NOTHING
    loaded = _load(home[0], root)
    return getattr(loaded, home[1], NOTHING)


def borrowed_modules() -> list[str]:
    """The Accelerate modules executed so far in this process (each one of `HELPER_MODULES`)."""
    return sorted(_LOADED)
