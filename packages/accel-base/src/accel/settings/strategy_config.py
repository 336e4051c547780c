"""A strategy's config object from `ACCEL_STRATEGY_CONFIG` (or a config file's `strategy_config:`): the
JSON keyword arguments of the config class the strategy declares."""

from __future__ import annotations

import json
from typing import Any

from ..adapter import registry
from ..errors import SettingError


def strategy_config_from_json(strategy: str | None, raw: str) -> Any:
    """The config object of `strategy` from JSON keyword arguments (a plain dict for strategies that
    declare no config class).

    Raises:
        SettingError: `raw` is not a JSON object. The config class raises on bad fields.
    """
    try:
        kwargs = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingError("ACCEL_STRATEGY_CONFIG", f"not valid JSON ({exc}); unset it or fix it") from None
    if not isinstance(kwargs, dict):
        raise SettingError("ACCEL_STRATEGY_CONFIG", "must be a JSON object of the strategy config's fields")
    cls = strategy_config_class(strategy)
    return kwargs if cls is None else cls(**kwargs)


def strategy_config_class(strategy: str | None) -> type[Any] | None:
    """The config class whose keyword arguments `ACCEL_STRATEGY_CONFIG` holds for `strategy` (None: a plain
    dict). The base strategies' are known here; a strategy from another package is found through the
    strategy registry (its class's `config_class`), so the core imports no strategy package.

    Raises:
        SettingError: the megatron strategy without accel-megatron installed.
    """
    if strategy == "fsdp2":
        from ..strategies.fsdp import FSDPConfig

        return FSDPConfig
    if strategy == "deepspeed":
        from ..strategies.deepspeed.config import DeepSpeedPlugin

        return DeepSpeedPlugin
    if strategy is None:
        return None
    record = registry.strategy_records().get(strategy)
    if record is None or not record.ok:
        if strategy == "megatron":
            raise SettingError("strategy", "megatron needs accel-megatron: pip install 'accel-megatron[megatron]'")
        return None
    return getattr(record.loaded, "config_class", None)
