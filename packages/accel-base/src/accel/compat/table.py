"""Why a name of Accelerate is not in accel, and what to use instead.

`missing_attribute` answers for a name accel lacks: modules that mirror Accelerate's
(`accel`, `accel.utils`, `accel.data_loader`, ...) call it from their `__getattr__`. A
deliberate omission imports as a stand-in whose use says why and what to use instead (an
import error could not carry the reason); other names raise AttributeError. docs/accelerate_compat.md is generated from these reasons
(compat_tests/gen_compat_table.py).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import AccelError

_BIG_MODEL = (
    "big-model inference (device maps, offloading, quantized loading) is outside accel's scope: load with "
    "transformers' `from_pretrained(device_map=...)` or keep using Accelerate's `big_modeling` for inference"
)
_LAUNCHER = (
    "launcher internals of Accelerate: `accel launch` (torchrun underneath) accepts `accelerate launch`'s "
    "flags and sets up the processes itself"
)
_PARALLEL = (
    "N-D parallelism is configured with `ParallelismConfig` (tp_size, dp_shard_size, ...; docs/parallelism.md); "
    "DeepSpeed sequence parallelism and the deprecated TP plugin are not supported"
)
_STRATEGY = (
    "FSDP/DeepSpeed internals of Accelerate: accel's strategies do this inside `prepare`, `save_state` and `save_model`"
)
_FP8 = "fp8 conversion is done by the adapter's precision object: `Accelerator(mixed_precision='fp8')` with a recipe"
_HARDWARE = (
    "hardware-specific: such names come from the adapter package for that hardware (`accel env` lists the "
    "installed adapters); the core names no hardware"
)

# Reasons for names accel deliberately lacks (patterns are matched against the bare name).
REASONS: dict[str, str] = {
    r"cpu_offload|cpu_offload_with_hook|disk_offload|dispatch_model|init_empty_weights|init_on_device": _BIG_MODEL,
    r"load_checkpoint_and_dispatch|load_checkpoint_in_model|infer_auto_device_map|get_balanced_memory": _BIG_MODEL,
    r"get_max_memory|get_max_layer_size|compute_module_sizes|calculate_maximum_sizes|check_device_map": _BIG_MODEL,
    r"align_module_device|has_offloaded_params|named_module_tensors|set_module_tensor_to_device": _BIG_MODEL,
    r"load_offloaded_weights?|offload_weight|offload_state_dict|save_offload_index|OffloadedWeightsLoader": _BIG_MODEL,
    r"PrefixedDataset|extract_submodules_state_dict|find_tied_parameters|retie_parameters|id_tensor_storage": _BIG_MODEL,
    r"check_tied_parameters_.*|convert_file_size_to_int|dtype_byte_size|CustomDtype|load_state_dict": _BIG_MODEL,
    r"BnbQuantizationConfig|load_and_quantize_model|has_4bit_bnb_layers": _BIG_MODEL,
    r"prepare_pippy": "pipeline-parallel inference (PiPPy) is outside accel's scope",
    r"PrepareForLaunch|prepare_(\w+_cmd_env|multi_\w+_env|sagemager_args_inputs|t.u)": _LAUNCHER,
    r"ComputeEnvironment|SageMakerDistributedType": (
        "Accelerate's config files and SageMaker launcher: `accel config` writes accel's config and reads "
        "Accelerate's; SageMaker is not supported"
    ),
    r"MegatronLMDummy(Scheduler|DataLoader)|MegatronEngine|AbstractTrainStep|GPTTrainStep|avg_losses_across_data_parallel_group|gather_across_data_parallel_groups": (
        "Megatron-LM support comes from the accel-megatron package, which has this name: "
        "`from accel_megatron import ...` (`pip install 'accel-megatron[megatron]'`)"
    ),
    r"MegatronLM.*|.*TrainStep|megatron_lm_.*|add_model_config_to_megatron_parser": (
        "Megatron-LM support comes from the accel-megatron package (`pip install 'accel-megatron[megatron]'`)"
    ),
    r"MSAMPRecipeKwargs": "MS-AMP is not supported; use TERecipeKwargs or AORecipeKwargs",
    r"DataLoaderAdapter|DataLoaderStateMixin|SkipDataLoader|SkipBatchSampler": (
        "accel's prepared loaders resume through `skip_first_batches(loader, n)` or "
        "`DataLoaderConfiguration(use_stateful_dataloader=True)`, without these wrapper classes"
    ),
    r"ThreadLocalSharedDict|do_nothing": "internal helper of Accelerate's state objects",
    r"(SAFE_)?(MODEL|WEIGHTS|OPTIMIZER|SCHEDULER|SCALER|SAMPLER|RNG_STATE)(_INDEX|_PATTERN)?_NAME|PROFILE_PATTERN_NAME": (
        "accel's checkpoint files are named in its manifest (docs/checkpoints.md); use `save_state`/`load_state` "
        "and `save_model` rather than file names"
    ),
    r"TORCH_LAUNCH_PARAMS|TORCH_DISTRIBUTED_OPERATION_TYPES|.*_PROFILING_AVAILABLE_PYTORCH_VERSION": (
        "constant of Accelerate's launcher and profiler internals"
    ),
    r"TorchTensorParallelPlugin|DeepSpeedSequenceParallelConfig": _PARALLEL,
    r"get_model_tp_size|torch_tp_plugin": _PARALLEL,
    r"device_mesh|parallelism_config": (
        "read them from the Accelerator: `accelerator.torch_device_mesh`, `accelerator.parallelism_config`"
    ),
    r"fsdp2_.*|(enable|disable)_fsdp_ram_efficient_loading": _STRATEGY,
    r"ensure_weights_retied|get_fsdp2_grad_scaler|compile_regions_(fsdp2|deepspeed)|GatheredParameters": _STRATEGY,
    r"deepspeed_engine_wrapped": (
        "the engines are the prepared models; `Accelerator.backward` runs the one prepared with an optimizer "
        "(`accelerator.strategy.engine`)"
    ),
    r"apply_fp8_autowrap|contextual_fp8_autocast|convert_model|convert_model_to_fp8_ao|has_ao_layers": _FP8,
    r"has_transformer_engine_layers|filter_first_and_last_linear_layers": _FP8,
    r"get_grad_scaler|get_mixed_precision_context_manager": (
        "the adapter in use owns the grad scaler and autocast: use `accelerator.scaler` and `accelerator.autocast()`"
    ),
    r"move_to_device|patch_optimizer_step": "internal helper of Accelerate's optimizer wrapper",
    r"test_launch|set_numa_affinity|check_os_kernel|get_cpu_distributed_information": _LAUNCHER,
    r"downcast_bfloat": "a bf16 downcast flag of one hardware runtime: set by that hardware's adapter, not the core",
}


class AccelerateNameError(AccelError, AttributeError):
    """A name of Accelerate that accel does not provide; the message says why and what to use."""


class AccelerateFeatureError(AccelError, NotImplementedError):
    """An Accelerate feature asked for through an argument accel has, in a form accel does not support."""


# Members of Accelerate's `Accelerator` and state objects that accel deliberately lacks (by owner). Looked up only
# by the owners' `__getattr__`, which Python calls on a miss: members that exist cost nothing.
UNSUPPORTED_MEMBERS: dict[str, str] = {
    "Accelerator": r"deepspeed_engine_wrapped",
    "AcceleratorState": r"downcast_bfloat|megatron_lm_plugin",
    "GradientState": r"_?is_[a-z0-9]+_gradients_synced",
}


class Unsupported:
    """Stand-in for an Accelerate name accel deliberately lacks: importing it works (so a script's
    import line is not where it breaks), and using it raises `NotImplementedError` saying why."""

    def __init__(self, qualified_name: str, reason: str) -> None:
        self._message = f"`{qualified_name}` is not supported by accel: {reason}."

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(self._message)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotImplementedError(self._message)

    def __repr__(self) -> str:
        return f"<unsupported: {self._message}>"


def reason_for(name: str) -> str | None:
    """Why accel lacks Accelerate's `name` (None if it is not a known omission)."""
    for pattern, reason in REASONS.items():
        if re.fullmatch(pattern, name):
            return reason
    return None


def missing_member(owner: str, name: str) -> AttributeError:
    """The error for reading `name` from accel's `owner` ("Accelerator", "AcceleratorState", ...) when it lacks it.

    A member Accelerate 1.15 has and accel deliberately lacks gives an `AccelerateNameError` (an
    `AttributeError`, so `hasattr` and `getattr(obj, name, default)` keep working) saying why and what to use;
    any other name the `AttributeError` Python would give, naming `owner`.
    """
    pattern = UNSUPPORTED_MEMBERS.get(owner)
    if pattern is not None and re.fullmatch(pattern, name):
        reason = reason_for(name) or _HARDWARE
        return AccelerateNameError(f"`{owner}.{name}` of Accelerate is not supported by accel: {reason}.")
    return AttributeError(f"'{owner}' object has no attribute '{name}'")


def missing_attribute(accelerate_module: str, name: str, accel_module: str) -> Any:
    """What `accel_module.name` gives for a name accel lacks that Accelerate has as `accelerate_module.name`.

    A deliberate omission (`REASONS`) gives an `Unsupported` stand-in whose use raises
    `NotImplementedError` with the reason; any other name raises `AttributeError` (for
    `is_*_available` and `check_*` names: that hardware names come from adapter packages).
    """
    if name.startswith("__"):
        raise AttributeError(f"module {accel_module!r} has no attribute {name!r}")
    reason = reason_for(name)
    if reason is not None:
        return Unsupported(f"{accelerate_module}.{name}", reason)
    if re.fullmatch(r"is_[a-z0-9_]+_available", name) or name.startswith("check_"):
        raise AccelerateNameError(f"`{accelerate_module}.{name}`: {_HARDWARE}.")
    raise AttributeError(
        f"module {accel_module!r} has no attribute {name!r} (docs/accelerate_compat.md lists what accel "
        f"provides for `{accelerate_module}`)"
    )
