"""Module paths of accel 0.x before its modules moved into folders, kept importable for one minor release.

`import accel.prepared` (or `from accel.adapter_options import AdapterOptions`) still works and gives the
module at its new path (`accel.prepare.prepared`), with a `DeprecationWarning` naming that path. Nothing
in accel imports an old path; this is for adapters and scripts written against the flat layout.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType

MOVED: Mapping[str, str] = {
    "accel.accelerate_config": "accel.compat.config_file",
    "accel.accelerate_env": "accel.compat.env",
    "accel.accelerate_objects": "accel.compat.objects",
    "accel.accelerate_settings": "accel.compat.settings",
    "accel.accelerator_compat": "accel.compat.accelerator",
    "accel.compat_table": "accel.compat.table",
    "accel.environment": "accel.compat.environment",
    "accel.handlers": "accel.compat.handlers",
    "accel.imports": "accel.compat.imports",
    "accel.memory": "accel.compat.memory",
    "accel.other": "accel.compat.other",
    "accel.tqdm": "accel.compat.tqdm",
    "accel.operations": "accel.compat.operations",
    "accel.adapter_options": "accel.adapter.options",
    "accel.adapters": "accel.adapter",
    "accel.adapters.cpu": "accel.adapter.cpu",
    "accel.registry": "accel.adapter.registry",
    "accel.checkpoint_io": "accel.checkpoint.io",
    "accel.checkpoint_layout": "accel.checkpoint.layout",
    "accel.checkpoint_validate": "accel.checkpoint.validate",
    "accel.compile": "accel.prepare.wrappers",
    "accel.prepare_group": "accel.prepare.group",
    "accel.prepared": "accel.prepare.prepared",
    "accel.config_file": "accel.settings.config_file",
    "accel.kwargs": "accel.settings.kwargs",
    "accel.data_dispatch": "accel.data.dispatch",
    "accel.data_iterable": "accel.data.iterable",
    "accel.data_samplers": "accel.data.samplers",
    "accel.data_shard": "accel.data.shard",
    "accel.debug": "accel.distributed.debug",
    "accel.distributed_type": "accel.distributed.distributed_type",
    "accel.launch_env": "accel.distributed.launch_env",
    "accel.ops": "accel.distributed.ops",
    "accel.rng": "accel.distributed.rng",
    "accel.tree": "accel.distributed.tree",
    "accel.fp8_emulation": "accel.precision.fp8_emulation",
    "accel.parallelism_config": "accel.strategies.parallelism_config",
    "accel.strategies.deepspeed_checkpoint": "accel.strategies.deepspeed.checkpoint",
    "accel.strategies.deepspeed_config": "accel.strategies.deepspeed.config",
    "accel.strategies.deepspeed_optim": "accel.strategies.deepspeed.optim",
    "accel.strategies.deepspeed_plugins": "accel.strategies.deepspeed.plugins",
    "accel.tracker_base": "accel.trackers.base",
    "accel.tracker_libraries": "accel.trackers.libraries",
    "accel.selftest": "accel.commands.selftest",
    "accel.worker_bootstrap": "accel.commands.worker_bootstrap",
}
"""Old module path -> new one. Old paths that became packages of the same name (`accel.adapter`,
`accel.checkpoint`, `accel.data`, `accel.precision`, `accel.prepare`, `accel.trackers`,
`accel.strategies.deepspeed`) and the public modules (`accel.state`, `accel.optimizer`,
`accel.scheduler`) need no entry: they still import, and re-export their public names."""


class _MovedLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path goes in the next minor release).",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the old name's spec on the module: its own goes back.
        own = importlib.util.find_spec(module.__name__)
        if own is not None:
            module.__spec__ = own


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths in `MOVED` (and only those)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(), is_package=fullname == "accel.adapters")


def install() -> None:
    """Put the finder on `sys.meta_path` once (done when `accel` is imported)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        # First: a path finder would load a second copy of a moved file through an aliased package.
        sys.meta_path.insert(0, MovedModuleFinder())


install()
