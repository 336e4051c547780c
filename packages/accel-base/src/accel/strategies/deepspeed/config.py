"""DeepSpeed configuration: the plugin, the config-file stand-ins, and how "auto" is filled.

Pure Python: nothing here imports DeepSpeed, so the plugin can be built (and its errors
raised) before the engine exists. `resolve_config` is the one place that decides every
value the engine sees; docs/deepspeed.md has the precedence as a table.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import AccelError

AUTO = "auto"
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DEFAULT_ZERO_STAGE = 2


class DeepSpeedConfigError(AccelError, ValueError):
    """A DeepSpeed setting conflicts with the Accelerator's, or cannot be filled."""


class HfDeepSpeedConfig:
    """A parsed DeepSpeed config that can be queried (Accelerate's `accelerate.utils.HfDeepSpeedConfig`, which
    transformers subclasses): `config` is the dict, `is_zero3()` / `is_offload()` / `get_value("a.b")` read it.

    Takes a dict (copied), a path to a JSON file, a JSON string or a base64 (URL-safe) encoded JSON string.
    `DeepSpeedPlugin(hf_ds_config=...)` takes one and keeps it: its `config` is the plugin's live config.

    Raises:
        ValueError: anything else (Accelerate's message).
    """

    def __init__(self, config_file_or_dict: Any) -> None:
        self.config: dict[str, Any] = _parse_config(config_file_or_dict)
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Read the ZeRO stage (-1 when unset) and whether ZeRO-2/3 offloads to "cpu" or "nvme"."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        devices = {
            self.get_value("zero_optimization.offload_optimizer.device"),
            self.get_value("zero_optimization.offload_param.device"),
        }
        self._offload = (self.is_zero2() or self.is_zero3()) and bool(devices & {"cpu", "nvme"})

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of a dotted key, and that part (None when a parent is missing)."""
        *parents, key = ds_key_long.split(".")
        node: Any = self.config
        for name in parents:
            node = node.get(name)
            if node is None:
                return None, key
        return node, key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at a dotted key (`"zero_optimization.stage"`), or `default` when it is not set."""
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Remove the section at a dotted key; a missing one is an error only with `must_exist`."""
        node: Any = self.config
        parent: Any = None
        name = ""
        for name in ds_key_long.split("."):
            parent, node = node, node.get(name)
            if node is None:
                if must_exist:
                    raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
                return
        if parent is not None:
            parent.pop(name)

    def is_true(self, ds_key_long: str) -> bool:
        """True only if the key is set to a true value."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True only if the key is set to a false value."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        return bool(self._stage == 2)

    def is_zero3(self) -> bool:
        return bool(self._stage == 3)

    def is_offload(self) -> bool:
        return bool(self._offload)


def _parse_config(value: Any) -> dict[str, Any]:
    """A DeepSpeed config from a dict (copied), a JSON file, a JSON string or base64-encoded JSON."""
    if isinstance(value, dict):
        return copy.deepcopy(value)
    if isinstance(value, (str, Path)) and Path(value).is_file():
        return load_config(value)
    try:
        try:
            loaded = json.loads(value)
        except json.JSONDecodeError:
            loaded = json.loads(base64.urlsafe_b64decode(value).decode("utf-8"))
    except (UnicodeDecodeError, AttributeError, ValueError, TypeError):
        raise ValueError(
            "Expected a string path to an existing deepspeed config, or a dictionary, or a base64 encoded string. "
            f"Received: {value}"
        ) from None
    if not isinstance(loaded, dict):
        raise ValueError(f"A DeepSpeed config must be a JSON object; got {type(loaded).__name__}.")
    return loaded


@dataclass(kw_only=True)
class DeepSpeedPlugin:
    """How the DeepSpeed engine trains. Pass it as `Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))`.

    Every field left at None is taken from the config (`hf_ds_config`) when the config sets
    it, else from the Accelerator, else from the default named on the field. A value set
    both here (or on the Accelerator) and in the config must agree, or `prepare` raises
    `DeepSpeedConfigError` naming both.
    """

    hf_ds_config: Any = None
    """A DeepSpeed config: a path to a JSON file, a dict, or an `HfDeepSpeedConfig` (Accelerate's or
    transformers' included). Values may be "auto" (filled by accel). After construction it is an
    `HfDeepSpeedConfig`-like object whose `config` is this plugin's live config (`deepspeed_config`), as in
    Accelerate (transformers' Trainer reads `plugin.hf_ds_config.config`)."""
    zero_stage: int | None = None
    """ZeRO stage: 0 (data parallel), 1 (shard optimizer state), 2 (+ gradients), 3 (+ parameters).
    Each stage saves memory and adds communication. Default 2."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches per optimizer step. Default: the Accelerator's `gradient_accumulation_steps`."""
    gradient_clipping: float | None = None
    """Clip the global gradient norm to this inside the engine's step (0 turns clipping off).
    Default: the adapter's default, else 1.0, the value Accelerate fills when nobody sets it
    (DeepSpeed's own default is 0, no clipping)."""
    offload_optimizer_device: str | None = None
    """"cpu" or "nvme": keep optimizer state (and run the step) off the accelerator. Saves device
    memory; costs host transfers every step. ZeRO stage >= 1."""
    offload_param_device: str | None = None
    """"cpu" or "nvme": keep sharded parameters off the accelerator between uses. ZeRO-3 only."""
    offload_optimizer_nvme_path: str | None = None
    """Directory for optimizer state when `offload_optimizer_device="nvme"`."""
    offload_param_nvme_path: str | None = None
    """Directory for parameters when `offload_param_device="nvme"`."""
    zero3_init_flag: bool | None = None
    """ZeRO-3 aware model construction. When on (the default under ZeRO stage 3, as in
    Accelerate), `transformers` models built after the Accelerator (`from_pretrained`,
    `from_config`) are partitioned over the processes as they are built, through transformers'
    DeepSpeed hook (what `HfDeepSpeedConfig` registers); any other model can be built inside
    `accelerator.strategy.zero3_init(accelerator)`. A model larger than one process's memory then
    never exists whole. True under another stage is turned off with a warning (Accelerate's)."""
    zero3_save_16bit_model: bool | None = None
    """ZeRO-3 `save_model`: gather the weights in the training dtype (16-bit under bf16/fp16).
    Sets `stage3_gather_16bit_weights_on_model_save`. Default True."""
    is_train_batch_min: bool = True
    """When several data loaders are prepared (train and eval), whether the smallest per-process batch size
    (True, Accelerate's default) or the largest fills `train_micro_batch_size_per_gpu` when it is "auto"."""
    transformer_moe_cls_names: str | None = None
    """Comma-separated class names of the model's mixture-of-experts layers: under ZeRO-3 each is a leaf module
    (`deepspeed.utils.set_z3_leaf_modules`), gathered whole instead of parameter by parameter, as Accelerate sets
    them before building the engine. A name no module has is an error."""
    enable_msamp: bool | None = None
    """Accelerate's MS-AMP fp8 through `msamp.deepspeed.initialize`: refused when True (MS-AMP is deprecated in
    Accelerate and not installable here); fp8 under DeepSpeed goes through the adapter's fp8 backend instead."""
    msamp_opt_level: str | None = None
    """MS-AMP's optimization level: taken only with `enable_msamp`, which is refused."""
    extra_config: dict[str, Any] = field(default_factory=dict)
    """Merged into the config last (keys the plugin has no field for)."""
    _selected: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.enable_msamp:
            raise DeepSpeedConfigError(
                "enable_msamp=True: MS-AMP is not supported by accel (Accelerate deprecates it and its package does not "
                "install here). Use mixed_precision='fp8', which the adapter's fp8 backend (TransformerEngine, torchao "
                "or the vendor's) runs under DeepSpeed."
            )
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3; got {self.zero_stage!r}.")
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value is not None and value not in OFFLOAD_DEVICES:
                raise ValueError(f"{name} must be one of {OFFLOAD_DEVICES}; got {value!r}.")
        if self.gradient_accumulation_steps is not None and self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1; got {self.gradient_accumulation_steps}.")
        if self.gradient_clipping is not None and self.gradient_clipping < 0:
            raise ValueError(f"gradient_clipping must be >= 0; got {self.gradient_clipping}.")
        given = self.hf_ds_config is not None
        if self.hf_ds_config is not None and isinstance(getattr(self.hf_ds_config, "config", None), dict):
            # An HfDeepSpeedConfig (accel's, Accelerate's or transformers' subclass): its dict is the config, as
            # in Accelerate, so what its owner writes into it later (transformers fills "auto") is seen here.
            self.user_config = self.hf_ds_config.config
        else:
            self.user_config = load_config(self.hf_ds_config)
            self.hf_ds_config = HfDeepSpeedConfig(self.user_config)
            self.hf_ds_config.config = self.user_config
        if given and "zero_optimization" not in self.user_config:
            # Accelerate's rule and message: a DeepSpeed config names its ZeRO section (`{}` takes the defaults).
            raise DeepSpeedConfigError("Please specify the ZeRO optimization config in the DeepSpeed config.")
        if self.zero3_init_flag is None:
            self.zero3_init_flag = self.zero_stage_resolved == 3
        elif self.zero3_init_flag and self.zero_stage_resolved != 3:
            warnings.warn(
                "DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3. Setting it to False.", stacklevel=3
            )
            self.zero3_init_flag = False

    @property
    def selected(self) -> bool:
        """Whether this is the Accelerator's active plugin: the one the next model is prepared with (the
        first of `Accelerator(deepspeed_plugins={name: plugin, ...})` until
        `accelerator.state.select_deepspeed_plugin(name)` picks another). Read-only, as in Accelerate."""
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        raise NotImplementedError(
            "'enabled' can only be set through calling 'AcceleratorState().enable_deepspeed_plugin(key)'. "
            "(That method is named `select_deepspeed_plugin(name)` in Accelerate 1.15 and in accel.)"
        )

    def select(self, _from_accelerator_state: bool = False) -> None:
        """Mark this plugin active; only `AcceleratorState.select_deepspeed_plugin(name)` may call it.

        Raises:
            ValueError: called directly (Accelerate's message): select a plugin through the state.
        """
        if not _from_accelerator_state:
            raise ValueError(
                "A `DeepSpeedPlugin` object must be enabled manually by calling "
                "`AcceleratorState().enable_deepspeed_plugin(plugin_key)`. "
                "(That method is named `select_deepspeed_plugin(name)` in Accelerate 1.15 and in accel.)"
            )
        self._selected = True

    def unselect(self) -> None:
        """Mark this plugin inactive (the DeepSpeed strategy does, when it selects another)."""
        self._selected = False

    _unselect = unselect  # Accelerate's name

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config as a dict (Accelerate's `DeepSpeedPlugin.deepspeed_config`), live.

        Before `prepare`: the user's config (`hf_ds_config`, copied) with this plugin's settings,
        and "auto" for what `prepare` fills (the batch sizes; the accumulation steps unless set
        here). A value set in it before `prepare` is used as if the config file held it, e.g.
        `deepspeed_config["train_micro_batch_size_per_gpu"] = 4` for a run that prepares no data
        loader. Once this plugin's engine is built: the complete config the engine was built
        with, every "auto" filled.
        """
        config = self.user_config
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu"):
            config.setdefault(key, AUTO)
        config.setdefault("gradient_accumulation_steps", self.gradient_accumulation_steps or AUTO)
        zero = config.setdefault("zero_optimization", {})
        if self.zero_stage is not None:
            zero.setdefault("stage", self.zero_stage)
        return config

    @deepspeed_config.setter
    def deepspeed_config(self, value: dict[str, Any]) -> None:
        """Replace the config (transformers' Trainer assigns its processed `hf_ds_config.config`)."""
        if not isinstance(value, dict):
            raise TypeError(f"deepspeed_config must be a dict; got {type(value).__name__}.")
        self.user_config = value

    def moe_leaf_classes(self, model: torch.nn.Module) -> list[type[torch.nn.Module]]:
        """The classes `transformer_moe_cls_names` names, found among `model`'s modules.

        Raises:
            ValueError: a name no module of the model has (Accelerate's message).
        """
        if not self.transformer_moe_cls_names:
            return []
        by_name = {type(m).__name__: type(m) for m in model.modules()}
        classes = []
        for name in (n.strip() for n in self.transformer_moe_cls_names.split(",")):
            if name not in by_name:
                raise ValueError(f"Could not find a transformer layer class called '{name}' to wrap in the model.")
            classes.append(by_name[name])
        return classes

    def is_zero3_init_enabled(self) -> bool:
        """Whether models are partitioned as they are built (`zero3_init_flag`, resolved)."""
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Turn ZeRO-3 aware construction on or off inside the context (Accelerate's), e.g. to
        build a small reference model whole: `with plugin.zero3_init_context_manager(enable=False):`.

        Raises:
            ValueError: `enable=True` under a ZeRO stage other than 3.
        """
        if enable and self.zero_stage_resolved != 3:
            raise ValueError(
                f"zero3 init needs ZeRO stage 3; this DeepSpeedPlugin resolves to stage {self.zero_stage_resolved}."
            )
        old = self.zero3_init_flag
        self.zero3_init_flag = enable
        try:
            yield
        finally:
            self.zero3_init_flag = old

    @property
    def maps_client_optimizer(self) -> bool:
        """Whether a torch optimizer passed to `prepare` is replaced by DeepSpeed's CPU optimizer.

        True when the optimizer is offloaded (`offload_optimizer_device`, or the config's
        `zero_optimization.offload_optimizer.device`, is not "none") and the config's
        `zero_force_ds_cpu_optimizer` is not false: Accelerate's rule (see
        `accel.strategies.deepspeed.map_pytorch_optim_to_deepspeed`).
        """
        config = copy.deepcopy(self.user_config)
        config.update(copy.deepcopy(self.extra_config))
        if self.offload_optimizer_device is not None:
            zero = config.setdefault("zero_optimization", {})
            zero.setdefault("offload_optimizer", {})["device"] = self.offload_optimizer_device
        return offloads_to_cpu_optimizer(config)

    @property
    def zero_stage_resolved(self) -> int:
        """The ZeRO stage the engine will use (plugin, else config, else 2)."""
        config_stage = self.user_config.get("zero_optimization", {}).get("stage", AUTO)
        if self.zero_stage is not None:
            return self.zero_stage
        return DEFAULT_ZERO_STAGE if config_stage == AUTO else int(config_stage)


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The active DeepSpeed plugin of `state` (an `AcceleratorState`): the one the next prepared model is
    built with (`state.select_deepspeed_plugin(name)` changes it).

    Raises:
        ValueError: the Accelerator does not use DeepSpeed (Accelerate's message).
    """
    plugin = getattr(state, "deepspeed_plugin", None)
    if plugin is None:
        raise ValueError(
            "Couldn't retrieve the active `DeepSpeedPlugin` as none were enabled. "
            "Please make sure that either `Accelerator` is configured for `deepspeed` "
            "or make sure that the desired `DeepSpeedPlugin` has been enabled "
            "(`AcceleratorState().select_deepspeed_plugin(name)`) before calling this function."
        )
    return plugin  # type: ignore[no-any-return]


def offloads_to_cpu_optimizer(config: dict[str, Any]) -> bool:
    """Accelerate's test on a config: the optimizer is offloaded and `zero_force_ds_cpu_optimizer`
    is not false, so a torch optimizer must become DeepSpeed's CPU optimizer."""
    device = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    return device not in (None, "none", AUTO) and bool(config.get("zero_force_ds_cpu_optimizer", True))


def load_config(config: str | Path | dict[str, Any] | None) -> dict[str, Any]:
    """The user's config as a fresh dict (a JSON file is read; a dict is deep-copied; a string that is no file
    is read as JSON or base64-encoded JSON, as Accelerate's `HfDeepSpeedConfig` reads it)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return copy.deepcopy(config)
    path = Path(config)
    if not path.is_file():
        if isinstance(config, str) and not config.endswith(".json"):
            with contextlib.suppress(ValueError):
                return _parse_config(config)  # a JSON or base64-encoded JSON string, as Accelerate takes
        raise FileNotFoundError(f"DeepSpeed config file {path} does not exist.")
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DeepSpeedConfigError(f"DeepSpeed config file {path} is not valid JSON: {exc}.") from exc
    if not isinstance(loaded, dict):
        raise DeepSpeedConfigError(f"DeepSpeed config file {path} must hold a JSON object.")
    return loaded


class DummyOptim(torch.optim.Optimizer):
    """Stand-in for an optimizer defined in the DeepSpeed config: pass it to `prepare`.

    Its `lr` and `weight_decay` fill "auto" in the config's optimizer params; DeepSpeed
    builds the real optimizer over its parameters.
    """

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        params = list(params)
        own = [dict(g) for g in params] if params and isinstance(params[0], dict) else None
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})
        # What DeepSpeed builds its optimizer over, as Accelerate hands it `params`: each param group with
        # the options the user gave it (a group's own weight_decay, say) and nothing filled in.
        groups = self.param_groups
        self.params = (
            [{**g, "params": pg["params"]} for g, pg in zip(own, groups)]
            if own
            else [{"params": g["params"]} for g in groups]
        )
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError("DummyOptim is a stand-in: prepare it with the model so DeepSpeed builds the optimizer.")


class DummyScheduler:
    """Stand-in for a scheduler defined in the DeepSpeed config (or built by `lr_scheduler_callable`)."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs

    def step(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("DummyScheduler is a stand-in: prepare it with the model so DeepSpeed builds the scheduler.")

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]


@dataclass(kw_only=True)
class AcceleratorValues:
    """What the Accelerator (and prepared objects) know, to fill "auto" and to check conflicts."""

    micro_batch_size: int | None
    gradient_accumulation_steps: int
    num_processes: int
    mixed_precision: str
    has_client_optimizer: bool
    dummy_optimizer: DummyOptim | None = None
    dummy_scheduler: DummyScheduler | None = None
    hidden_size: int | None = None
    """The model's `config.hidden_size` (or the largest of `config.hidden_sizes`), for the "auto" keys
    sized by it; None when the model has no such config."""
    model_has_config: bool = True
    """Whether the model has a `config` attribute at all (for the error text when it is needed)."""
    split_batches: bool = False
    """Whether batches are split over processes (then a DummyScheduler's total steps are not divided)."""


def _conflict(key: str, config_value: Any, source: str, value: Any) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(
        f"DeepSpeed config `{key}` is {config_value!r} but {source} is {value!r}. Set the value in one place "
        f'only, or make them equal (in the config, "auto" takes the value from {source}).'
    )


def _settle(config: dict[str, Any], key: str, path: str, value: Any, source: str, default: Any = None) -> None:
    """Fill `config[key]` from `value` (or `default`), raising when the config already holds another value."""
    current = config.get(key, AUTO)
    if value is None:
        if current == AUTO:
            if default is None:
                config.pop(key, None)
            else:
                config[key] = default
        return
    if current != AUTO and current != value:
        raise _conflict(path, current, source, value)
    config[key] = value


def resolve_config(
    plugin: DeepSpeedPlugin, values: AcceleratorValues, adapter_defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The complete config for `deepspeed.initialize`: the user's config, "auto" filled, conflicts refused.

    `adapter_defaults` (the adapter's `strategy_defaults("deepspeed")`, a partial DeepSpeed
    config) has the lowest precedence: it replaces accel's own defaults and fills keys that
    are absent or "auto" after the config, the plugin and the Accelerator have had their say.

    Raises:
        DeepSpeedConfigError: a value set differently in the config and in the plugin or
            Accelerator; an "auto" accel cannot fill; an optimizer/scheduler both in the
            config and in the code.
    """
    config = copy.deepcopy(plugin.user_config)
    defaults = adapter_defaults or {}

    # The Accelerator's 1 is its default, not a choice: a config or plugin value > 1 wins over it.
    accel_gas = values.gradient_accumulation_steps if values.gradient_accumulation_steps > 1 else None
    plugin_gas = plugin.gradient_accumulation_steps
    if plugin_gas is not None and accel_gas is not None and plugin_gas != accel_gas:
        raise _conflict("DeepSpeedPlugin.gradient_accumulation_steps", plugin_gas, "the Accelerator's value", accel_gas)
    _settle(
        config,
        "gradient_accumulation_steps",
        "gradient_accumulation_steps",
        plugin_gas or accel_gas,
        "the Accelerator's gradient_accumulation_steps",
        default=_default(defaults, "gradient_accumulation_steps", 1),
    )
    gas = int(config["gradient_accumulation_steps"])
    micro = values.micro_batch_size
    current = config.get("train_micro_batch_size_per_gpu", AUTO)
    if micro is None and current == AUTO:
        raise DeepSpeedConfigError(
            "When using DeepSpeed, `accelerate.prepare()` requires you to pass at least one of training or "
            "evaluation dataloaders with `batch_size` attribute returning an integer value or alternatively set an "
            "integer value in `train_micro_batch_size_per_gpu` in the deepspeed config file."
        )
    _settle(
        config, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", micro, "the prepared data loader"
    )
    total = int(config["train_micro_batch_size_per_gpu"]) * gas * values.num_processes
    _settle(config, "train_batch_size", "train_batch_size", total, "micro batch x accumulation x processes")

    # Accelerate fills 1.0 when nobody set it (DeepSpeed's own default would be 0: off).
    clip_default = _default(defaults, "gradient_clipping", 1.0)
    _settle(config, "gradient_clipping", "gradient_clipping", plugin.gradient_clipping, "DeepSpeedPlugin", clip_default)
    _resolve_precision(config, values.mixed_precision)
    _resolve_zero(config, plugin, defaults)
    _resolve_hidden_size_keys(config, values.hidden_size, values.model_has_config)
    _resolve_optimizer(config, values)
    _fill_defaults(config, defaults)
    for key, value in plugin.extra_config.items():
        config[key] = value
    left = _find_auto(config)
    if left:
        raise DeepSpeedConfigError(
            f'DeepSpeed config values {left} are "auto" but accel has nothing to fill them with: set them.'
        )
    return config


def _resolve_precision(config: dict[str, Any], mixed_precision: str) -> None:
    # fp8 trains its converted layers in fp8 and the engine in bf16, as Accelerate's DeepSpeed plugin does:
    # the run's precision converts the model before `deepspeed.initialize`.
    engine_precision = "bf16" if mixed_precision == "fp8" else mixed_precision
    for name in ("bf16", "fp16"):
        section = config.get(name)
        if section is None:
            continue
        enabled = section.get("enabled", AUTO)
        wanted = engine_precision == name
        if enabled == AUTO:
            section["enabled"] = wanted
        elif bool(enabled) != wanted:
            raise _conflict(f"{name}.enabled", enabled, "the Accelerator's mixed_precision", mixed_precision)
    if engine_precision in ("bf16", "fp16") and engine_precision not in config:
        config[engine_precision] = {"enabled": True}


def _resolve_zero(config: dict[str, Any], plugin: DeepSpeedPlugin, defaults: dict[str, Any]) -> None:
    zero = config.setdefault("zero_optimization", {})
    stage_default = _default(defaults, "zero_optimization.stage", DEFAULT_ZERO_STAGE)
    _settle(zero, "stage", "zero_optimization.stage", plugin.zero_stage, "DeepSpeedPlugin", stage_default)
    for kind, device, nvme in (
        ("offload_optimizer", plugin.offload_optimizer_device, plugin.offload_optimizer_nvme_path),
        ("offload_param", plugin.offload_param_device, plugin.offload_param_nvme_path),
    ):
        if device is None and nvme is None:
            continue
        section = zero.setdefault(kind, {})
        _settle(section, "device", f"zero_optimization.{kind}.device", device, "DeepSpeedPlugin")
        _settle(section, "nvme_path", f"zero_optimization.{kind}.nvme_path", nvme, "DeepSpeedPlugin")
    save16 = plugin.zero3_save_16bit_model
    _settle(
        zero,
        "stage3_gather_16bit_weights_on_model_save",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        save16,
        "DeepSpeedPlugin.zero3_save_16bit_model",
        default=_default(defaults, "zero_optimization.stage3_gather_16bit_weights_on_model_save", True),
    )


HIDDEN_SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")


def _resolve_hidden_size_keys(config: dict[str, Any], hidden_size: int | None, has_config: bool = True) -> None:
    """Fill "auto" bucket sizes from the model's hidden size, with Accelerate's formulas and messages."""
    zero = config.get("zero_optimization", {})
    wanted = [key for key in HIDDEN_SIZE_KEYS if zero.get(key) == AUTO]
    if not wanted:
        return
    if hidden_size is None:
        names = [f"zero_optimization.{key}" for key in wanted]
        missing = (
            "Can find neither `model.config.hidden_size` nor `model.config.hidden_sizes`"
            if has_config
            else "Can't find `model.config` entry"
        )
        raise DeepSpeedConfigError(
            f"{missing}, therefore it's not possible to automatically fill out the following `auto` entries in the "
            f"DeepSpeed config file: {names}. You can fix that by replacing `auto` values for these keys with an "
            "integer value of your choice."
        )
    sizes = {
        "reduce_bucket_size": hidden_size * hidden_size,
        "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
        "stage3_param_persistence_threshold": 10 * hidden_size,
    }
    for key in wanted:
        zero[key] = sizes[key]


def model_hidden_size(model: Any) -> int | None:
    """`model.config.hidden_size`, else the largest of `model.config.hidden_sizes`, else None."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if hidden is not None:
        return int(hidden)
    sizes = getattr(config, "hidden_sizes", None)
    return int(max(sizes)) if sizes else None


def _resolve_optimizer(config: dict[str, Any], values: AcceleratorValues) -> None:
    if "optimizer" in config and values.has_client_optimizer:
        raise DeepSpeedConfigError(
            "You cannot specify an optimizer in the config file and in the code at the same time. "
            "Please remove the optimizer from the config file or create `DummyOptim` in the code."
        )
    if values.dummy_optimizer is not None and "optimizer" not in config:
        raise DeepSpeedConfigError(
            "You cannot create a `DummyOptim` without specifying an optimizer in the config file."
        )
    if values.has_client_optimizer:
        # DeepSpeed refuses optimizers it has not tested (any torch optimizer) unless told.
        config.setdefault("zero_allow_untested_optimizer", True)
    dummy = values.dummy_optimizer
    if dummy is not None:
        params = config["optimizer"].setdefault("params", {})
        for key, value in (("lr", dummy.lr), ("weight_decay", dummy.weight_decay)):
            if params.get(key) == AUTO:
                params[key] = value
    sched = values.dummy_scheduler
    if sched is not None and "scheduler" in config:
        params = config["scheduler"].setdefault("params", {})
        total = sched.total_num_steps
        if total is not None and not values.split_batches:
            # Each process steps the schedule once per its own batches (Accelerate's rule).
            total = math.ceil(total / values.num_processes)
        # The peak lr is the scheduler's optimizer's (a DummyOptim or a torch optimizer), as in Accelerate.
        defaults = getattr(sched.optimizer, "defaults", None)
        max_lr = getattr(sched.optimizer, "lr", None) if defaults is None else defaults.get("lr")
        fill: dict[str, Any] = {
            "warmup_min_lr": 0,
            # DeepSpeed >= 0.19.6 refuses 0 warmup steps (DummyScheduler's default).
            "warmup_num_steps": max(1, sched.warmup_num_steps),
            "total_num_steps": total,
            "warmup_max_lr": max_lr,
        }
        for key, value in fill.items():
            if params.get(key) == AUTO and value is not None:
                params[key] = value


def _default(defaults: dict[str, Any], path: str, fallback: Any) -> Any:
    """The adapter's default at dotted `path`, else accel's `fallback`."""
    node: Any = defaults
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return fallback
        node = node[part]
    return node


def _fill_defaults(config: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Put the adapter's defaults where the resolved config still has nothing (or "auto")."""
    for key, value in defaults.items():
        current = config.get(key, AUTO)
        if isinstance(value, dict) and isinstance(current, dict):
            _fill_defaults(current, value)
        elif current == AUTO:
            config[key] = copy.deepcopy(value)


def _find_auto(config: Any, prefix: str = "") -> list[str]:
    if isinstance(config, dict):
        found: list[str] = []
        for key, value in config.items():
            found += _find_auto(value, f"{prefix}{key}.")
        return found
    return [prefix.rstrip(".")] if config == AUTO else []
