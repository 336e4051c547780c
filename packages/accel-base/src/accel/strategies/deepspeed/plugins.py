"""Several DeepSpeed plugins in one Accelerator: the plugins by name, and one record per engine built.

Pure Python (no DeepSpeed import), like `deepspeed_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import AccelError
from .config import DeepSpeedPlugin

DEFAULT_PLUGIN = "default"
"""The name of a DeepSpeed plugin given alone (`deepspeed_plugin=plugin`)."""

NO_PLUGINS = "deepspeed_plugins={} names no DeepSpeed plugin: pass `{name: DeepSpeedPlugin(...)}` with at least one."
"""The error for an empty `deepspeed_plugins` mapping (refused by the Accelerator and by the strategy alike)."""


@dataclass(kw_only=True)
class EngineRecord:
    """One DeepSpeed engine the strategy built, and what it was built from."""

    engine: Any
    plugin_name: str
    """The name of the plugin that was active when the model was prepared."""
    plugin: DeepSpeedPlugin
    config: dict[str, Any]
    """The resolved config the engine was initialised with."""
    trains: bool
    """Prepared with an optimizer (a torch one or `DummyOptim`)."""


def plugins_from_config(config: Any) -> tuple[dict[str, DeepSpeedPlugin], bool]:
    """The strategy's plugins by name, and whether they were given by name (`deepspeed_plugins={name: plugin}`).

    A single plugin, a DeepSpeed config dict or a path is one plugin named `DEFAULT_PLUGIN`.

    Raises:
        TypeError: not a plugin, a config, a path or a `{name: DeepSpeedPlugin}` mapping.
        ValueError: an empty mapping of plugins.
    """
    if config is None:
        return {DEFAULT_PLUGIN: DeepSpeedPlugin()}, False
    if isinstance(config, DeepSpeedPlugin):
        return {DEFAULT_PLUGIN: config}, False
    if isinstance(config, Mapping) and config and all(isinstance(v, DeepSpeedPlugin) for v in config.values()):
        return {str(k): v for k, v in config.items()}, True
    if isinstance(config, Mapping) and not config:
        raise ValueError(NO_PLUGINS)
    if isinstance(config, (dict, str, Path)):
        return {DEFAULT_PLUGIN: DeepSpeedPlugin(hf_ds_config=config)}, False
    raise TypeError(
        "The deepspeed strategy takes a DeepSpeedPlugin, a dict of DeepSpeedPlugins by name, a config dict or a "
        f"path; got {type(config)}."
    )


class UnknownDeepSpeedPluginError(AccelError, KeyError):
    """`get_deepspeed_plugin` / `select_deepspeed_plugin` with a name the Accelerator was not given (a KeyError,
    as Accelerate's dict lookup raises)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
