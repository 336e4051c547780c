"""Accelerate's FSDP, DeepSpeed and dynamo settings, translated into accel's.

Accelerate spells one setting three ways: a launch flag (`--fsdp_offload_params true`), a
config-file key (`fsdp_config: {fsdp_offload_params: true}`) and an environment variable
for the workers (`FSDP_OFFLOAD_PARAMS=true`). All three arrive here as a mapping from the
flag/key name to its value, and leave as keyword arguments for accel's own config classes
(`FSDPConfig`, `DeepSpeedPlugin`, `TorchDynamoPlugin`). A setting accel cannot honour is
a `SettingError` naming it and saying what to do; one whose absence changes no numbers is
returned as a note for the caller to print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import SettingError

TRUE = ("1", "true", "yes", "on", "y")
FALSE = ("0", "false", "no", "off", "n", "")


def as_bool(key: str, value: Any) -> bool:
    """Accelerate's boolean spellings ("true", "True", "1", "yes", a real bool)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise SettingError(key, f"expected true or false, got {value!r}")


def _int(key: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SettingError(key, f"expected an integer, got {value!r}") from None


def _float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SettingError(key, f"expected a number, got {value!r}") from None


def _names(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(v).strip() for v in items if str(v).strip()]


# Accelerate's FSDP1 sharding strategies, by name and by their 1-based index.
_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


def _sharding(key: str, value: Any) -> str:
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(_SHARDING):
        return _SHARDING[int(text) - 1]
    if text not in _SHARDING:
        raise SettingError(key, f"expected one of {', '.join(_SHARDING)}, got {value!r}")
    return text


def fsdp_kwargs(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`FSDPConfig` keyword arguments for Accelerate's `fsdp_*` settings, and notes to print.

    `fsdp_version: 1` runs FSDP1 (torch's FullyShardedDataParallel) with every FSDP1 option honoured, as
    Accelerate does; 2, or no version, runs FSDP2 (accel's default), where FSDP1-only options are mapped,
    refused, or noted as Accelerate notes them under FSDP2.

    Raises:
        SettingError: a setting the chosen FSDP version cannot honour (under FSDP2: NO_SHARD, hybrid sharding,
            forward prefetch; activation-checkpoint offload; an unknown key).
    """
    version = settings.get("fsdp_version")
    if version is not None:
        version = _int("fsdp_version", version)
        if version not in (1, 2):
            raise SettingError("fsdp_version", f"expected 1 or 2, got {settings['fsdp_version']!r}")
    v1 = version == 1
    out: dict[str, Any] = {"fsdp_version": 1} if v1 else {}
    notes: list[str] = []
    for key, value in settings.items():
        if value is None or key == "fsdp_version":
            continue
        if key == "fsdp_offload_params":
            out["cpu_offload"] = as_bool(key, value)
        elif key == "fsdp_min_num_params":
            out["min_num_params"] = _int(key, value)
        elif key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward") and v1:
            if key == "fsdp_reshard_after_forward" and settings.get("fsdp_sharding_strategy") is not None:
                continue  # the FSDP1 name wins, as in Accelerate's plugin
            if str(value).strip().lower() in TRUE + FALSE and not str(value).strip().isdigit():
                raise SettingError(key, "FSDP1 (fsdp_version 1) takes a sharding strategy name here, e.g. FULL_SHARD")
            out["sharding_strategy"] = _sharding(key, value).replace("HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2")
        elif key in ("fsdp_sharding_strategy", "fsdp_reshard_after_forward"):
            if key == "fsdp_sharding_strategy" and settings.get("fsdp_reshard_after_forward") is not None:
                continue  # FSDP2's own setting wins over the FSDP1 name (as in Accelerate)
            if key == "fsdp_reshard_after_forward" and str(value).strip().lower() in TRUE + FALSE:
                out["reshard_after_forward"] = as_bool(key, value)
                continue
            strategy = _sharding(key, value)
            if strategy == "NO_SHARD":
                raise SettingError(
                    key, "NO_SHARD under FSDP2 is plain data parallelism: use the ddp strategy, or fsdp_version 1"
                )
            if strategy.startswith("HYBRID"):
                raise SettingError(
                    key,
                    "hybrid sharding under FSDP2 is ParallelismConfig(dp_replicate_size=..., dp_shard_size=...) "
                    "(or parallelism_config_dp_replicate_size/_dp_shard_size; docs/parallelism.md), or fsdp_version 1",
                )
            out["reshard_after_forward"] = strategy == "FULL_SHARD"
        elif key == "fsdp_auto_wrap_policy":
            policy = str(value).strip().lower()
            if policy not in ("transformer_based_wrap", "size_based_wrap", "no_wrap"):
                raise SettingError(key, f"expected TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP, got {value!r}")
            out["auto_wrap_policy"] = policy
        elif key == "fsdp_transformer_layer_cls_to_wrap":
            out["transformer_cls_names_to_wrap"] = _names(value)
        elif key == "fsdp_state_dict_type":
            state_dict_type = str(value).strip().upper()
            if state_dict_type not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
                raise SettingError(key, f"expected FULL_STATE_DICT or SHARDED_STATE_DICT, got {value!r}")
            out["state_dict_type"] = state_dict_type
        elif key == "fsdp_activation_checkpointing":
            out["activation_checkpointing"] = as_bool(key, value)
        elif key == "fsdp_backward_prefetch":
            prefetch = str(value).strip().upper()
            if prefetch not in ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"):
                raise SettingError(key, f"expected BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH, got {value!r}")
            if v1:
                out["backward_prefetch"] = None if prefetch == "NO_PREFETCH" else prefetch
            elif prefetch != "NO_PREFETCH":
                notes.append(f"{key} is ignored: FSDP2 prefetches the next unit's parameters in backward by itself")
        elif key == "fsdp_forward_prefetch" and v1:
            out["forward_prefetch"] = as_bool(key, value)
        elif key == "fsdp_forward_prefetch":
            if as_bool(key, value):
                raise SettingError(key, "forward prefetch is FSDP1's: set fsdp_version 1, or set it to false")
        elif key == "fsdp_use_orig_params" and v1:
            out["use_orig_params"] = as_bool(key, value)
        elif key == "fsdp_use_orig_params":
            if not as_bool(key, value):
                raise SettingError(key, "FSDP2 always keeps the original parameters; set it to true, or fsdp_version 1")
        elif key == "fsdp_activation_checkpointing_offload":
            if as_bool(key, value):
                raise SettingError(key, "offloading checkpointed activations is not supported; set it to false")
        elif key == "fsdp_cpu_ram_efficient_loading":
            out["cpu_ram_efficient_loading"] = as_bool(key, value)
        elif key == "fsdp_sync_module_states" and v1:
            out["sync_module_states"] = as_bool(key, value)
        elif key == "fsdp_sync_module_states":
            if as_bool(key, value) and not as_bool(key, settings.get("fsdp_cpu_ram_efficient_loading", "false")):
                notes.append(
                    f"{key} is not honoured: FSDP2 shards each process's own initial weights, so seed every "
                    "process the same (accel.utils.set_seed), set fsdp_cpu_ram_efficient_loading (rank 0's "
                    "weights), or set fsdp_version 1"
                )
        elif key == "fsdp_ignored_modules":
            out["ignored_modules"] = str(value)
        else:
            raise SettingError(key, "not an FSDP setting accel knows")
    return out, notes


_DEEPSPEED_FIELDS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "deepspeed_config_file": ("hf_ds_config", lambda k, v: str(v)),
    "zero_stage": ("zero_stage", _int),
    "offload_optimizer_device": ("offload_optimizer_device", lambda k, v: str(v).lower()),
    "offload_param_device": ("offload_param_device", lambda k, v: str(v).lower()),
    "offload_optimizer_nvme_path": ("offload_optimizer_nvme_path", lambda k, v: str(v)),
    "offload_param_nvme_path": ("offload_param_nvme_path", lambda k, v: str(v)),
    "gradient_clipping": ("gradient_clipping", _float),
    "zero3_init_flag": ("zero3_init_flag", as_bool),
    "zero3_save_16bit_model": ("zero3_save_16bit_model", as_bool),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", _int),
}
_DEEPSPEED_MULTINODE = ("deepspeed_hostfile", "deepspeed_inclusion_filter", "deepspeed_exclusion_filter")


# Accelerate's plugin-level DeepSpeed settings that a `deepspeed_config_file` owns: naming one of them in
# Accelerate's config file next to the DeepSpeed file is an error there (`_deepspeed_config_checks`).
_OWNED_BY_DEEPSPEED_FILE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
    "mixed_precision",
)


def check_config_file_fields(fields: Iterable[str]) -> None:
    """Accelerate's refusal of plugin-level DeepSpeed settings in its config file next to `deepspeed_config_file`
    (`fields`: the config file's `deepspeed_config` keys, or `ACCELERATE_CONFIG_DS_FIELDS`).

    Raises:
        SettingError: one of them is named (Accelerate's message).
    """
    named = sorted(set(fields) & set(_OWNED_BY_DEEPSPEED_FILE))
    if named:
        raise SettingError(
            named[0],
            "When using `deepspeed_config_file`, the following accelerate config variables will be ignored: "
            f"{list(_OWNED_BY_DEEPSPEED_FILE)}. Please specify them appropriately in the DeepSpeed config file. If "
            "you are using an accelerate config file, remove others config variables mentioned in the above "
            "specified list.",
        )


def deepspeed_file_kwargs(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`deepspeed_kwargs` for the `deepspeed_config` section of Accelerate's config file, which also applies
    Accelerate's rule that the section names no plugin-level setting next to `deepspeed_config_file`.

    Raises:
        SettingError: as `deepspeed_kwargs`, or `check_config_file_fields`.
    """
    if settings.get("deepspeed_config_file") not in (None, "", "none"):
        check_config_file_fields(k for k, v in settings.items() if v is not None)
    return deepspeed_kwargs(settings)


def deepspeed_kwargs(settings: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`DeepSpeedPlugin` keyword arguments for Accelerate's DeepSpeed settings, and notes to print.

    Raises:
        SettingError: DeepSpeed's own multi-node launcher settings, or an unknown key.
    """
    out: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in settings.items():
        if value is None:
            continue
        if key in _DEEPSPEED_FIELDS:
            field, convert = _DEEPSPEED_FIELDS[key]
            out[field] = convert(key, value)
        elif key in _DEEPSPEED_MULTINODE:
            raise SettingError(
                key, "accel launch starts every node through torchrun; run `accel launch --nnodes N` on each node"
            )
        elif key == "deepspeed_multinode_launcher":
            if str(value).lower() != "standard":
                raise SettingError(key, "only 'standard' (torchrun on each node) is supported")
        elif key == "deepspeed_moe_layer_cls_names":
            out["transformer_moe_cls_names"] = ",".join(_names(value))
        else:
            raise SettingError(key, "not a DeepSpeed setting accel knows")
    return out, notes


def dynamo_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`TorchDynamoPlugin` keyword arguments for Accelerate's `dynamo_*` settings."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None:
            continue
        name = key.removeprefix("dynamo_")
        if name == "backend":
            out["backend"] = str(value).lower()
        elif name == "mode":
            out["mode"] = str(value)
        elif name in ("use_fullgraph", "use_dynamic", "use_regional_compilation"):
            field = {"use_fullgraph": "fullgraph", "use_dynamic": "dynamic"}.get(name, name)
            out[field] = as_bool(key, value)
        else:
            raise SettingError(key, "not a dynamo setting accel knows")
    return out


MEGATRON_RENAMES = {"context_parallel_size": "cp_degree"}


def megatron_kwargs(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`accel_megatron.MegatronPlugin` keyword arguments for Accelerate's `megatron_lm_*` settings.

    Raises:
        SettingError: accel-megatron is not installed, or it has no such option.
    """
    import dataclasses

    from ..settings.strategy_config import strategy_config_class

    try:
        plugin_class = strategy_config_class("megatron")  # accel-megatron's `MegatronPlugin`, through the registry
    except SettingError:
        plugin_class = None
    if plugin_class is None:
        raise SettingError(
            next(iter(settings), "megatron_lm"), "needs accel-megatron: pip install 'accel-megatron[megatron]'"
        )
    fields = {f.name: f for f in dataclasses.fields(plugin_class)}
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if value is None:
            continue
        name = key.removeprefix("megatron_lm_")
        name = MEGATRON_RENAMES.get(name, name)
        field = fields.get(name)
        if field is None:
            raise SettingError(key, "accel_megatron.MegatronPlugin has no such option; set it in the script")
        default = field.default
        if isinstance(default, bool):
            out[name] = as_bool(key, value)
        elif isinstance(default, int) or name in ("num_layers_per_virtual_pipeline_stage", "bucket_size"):
            out[name] = _int(key, value)
        elif name == "gradient_clipping":
            out[name] = _float(key, value)
        else:
            out[name] = value
    return out
