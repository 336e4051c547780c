"""`accel env`: versions, adapters, strategies, optional packages and the config file, for bug reports."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from ..adapter import registry
from ..settings.config_file import ConfigError, default_config_path
from .requirements import STRATEGY_REQUIRES, installed

# Optional packages accel-base uses when present: (import name, distribution, what needs it, pip requirement).
OPTIONAL = (
    ("deepspeed", "deepspeed", "the deepspeed strategy", "accel-base[deepspeed]"),
    ("tensorboard", "tensorboard", "the tensorboard tracker", "accel-base[tensorboard]"),
    ("yaml", "pyyaml", "config files (accel config, --config-file)", "pyyaml"),
    ("tqdm", "tqdm", "progress bars (accel.utils.tqdm)", "tqdm"),
    ("accel_megatron", "accel-megatron", "the megatron strategy", "accel-megatron[megatron]"),
    ("megatron.core", "megatron-core", "the megatron strategy (with accel-megatron)", "accel-megatron[megatron]"),
    ("wandb", "wandb", "the wandb tracker", "accel-base[wandb]"),
    ("mlflow", "mlflow", "the mlflow tracker", "accel-base[mlflow]"),
    ("comet_ml", "comet-ml", "the comet_ml tracker", "accel-base[comet_ml]"),
    ("aim", "aim", "the aim tracker", "accel-base[aim]"),
    ("clearml", "clearml", "the clearml tracker", "accel-base[clearml]"),
    ("dvclive", "dvclive", "the dvclive tracker", "accel-base[dvclive]"),
)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_report() -> str:
    """Versions and every installed adapter, available or not and why: made for bug reports."""
    import torch

    lines = [
        f"accel-base: {version('accel-base')}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"torch: {torch.__version__}",
        f"platform: {platform.platform()}",
        f"cpu cores: {os.cpu_count()}",
        "",
        "adapters:",
    ]
    for name, rec in sorted(registry.adapter_records().items()):
        if not rec.ok:
            lines.append(f"  {name:<10} BROKEN      {rec.distribution}: {rec.error}")
            continue
        cls = rec.loaded
        avail = registry.availability(cls)
        status = "available" if avail else "unavailable"
        lines.append(
            f"  {name:<10} {status:<11} priority={cls.priority} device={cls.hardware_device_type} "
            f"backend={cls.hardware_backend} ({rec.distribution} {version(rec.distribution)})"
            + (f": {avail.reason}" if avail.reason else "")
        )
    try:
        selected = registry.select_adapter(
            os.environ.get("ACCEL_ADAPTER") or None, emulate=os.environ.get("ACCEL_EMULATE") == "1"
        )
        lines.append(f"selected: {selected.name}")
    except Exception as exc:  # report, do not fail: this is a diagnostic command
        lines.append(f"selected: error: {exc}")
    lines += ["", "strategies:"]
    for name, rec in sorted(registry.strategy_records().items()):
        if not rec.ok:
            lines.append(f"  {name:<10} BROKEN: {rec.error}")
            continue
        need = STRATEGY_REQUIRES.get(name)
        if need and not installed(need[0].split(".")[0]):
            lines.append(f"  {name:<10} needs {need[0]}, not installed: pip install '{need[1]}'")
        else:
            lines.append(f"  {name:<10} ok ({rec.distribution})")
    lines += ["", "optional packages:"]
    for module, dist, used_for, requirement in OPTIONAL:
        present = installed(module.split(".")[0]) and (module == module.split(".")[0] or installed(module))
        state = f"installed {version(dist)}" if present else f"not installed (pip install '{requirement}')"
        lines.append(f"  {dist:<15} {state}; for {used_for}")
    lines += ["", _config_line()]
    accel_vars = {k: v for k, v in os.environ.items() if k.startswith(("ACCEL_", "ACCELERATE_"))}
    if accel_vars:
        lines += ["", "environment:"] + [f"  {k}={v}" for k, v in sorted(accel_vars.items())]
    return "\n".join(lines)


def _config_line() -> str:
    path = default_config_path()
    if not path.is_file():
        return f"config file: {path} (absent: accel launch uses its defaults)"
    from .config import show

    try:
        return "config file: " + show(path).replace("\n", "\n  ")
    except ConfigError as exc:
        return f"config file: {path} is unusable: {exc}"
