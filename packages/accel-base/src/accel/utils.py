"""What scripts import from Accelerate's `utils`, under the same names (`accelerate.utils` -> `accel.utils`).

The functions live in modules named for their concern (`accel.distributed.ops`, `accel.compat.operations`,
`accel.compat.environment`, `accel.compat.imports`, `accel.compat.memory`, `accel.distributed.rng`, `accel.compat.handlers`, ...);
this module gathers them. A name of Accelerate's `utils` that accel deliberately leaves out
imports as a stand-in whose use raises `NotImplementedError` saying why and what to use
instead; any other missing name raises `AttributeError` (docs/accelerate_compat.md lists both).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from .compat.environment import (
    are_libraries_initialized,
    clear_environment,
    convert_dict_to_env_variables,
    get_int_from_env,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    purge_accelerate_environment,
    str_to_bool,
)
from .compat.handlers import (
    AORecipeKwargs,
    DynamoBackend,
    FP8RecipeKwargs,
    LoggerType,
    PrecisionType,
    ProfileKwargs,
    TERecipeKwargs,
)
from .compat.imports import (
    compare_versions,
    deepspeed_required,
    is_4bit_bnb_available,
    is_8bit_bnb_available,
    is_aim_available,
    is_bf16_available,
    is_bitsandbytes_multi_backend_available,
    is_bnb_available,
    is_boto3_available,
    is_clearml_available,
    is_comet_ml_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_import_timer_available,
    is_lomo_available,
    is_matplotlib_available,
    is_megatron_lm_available,
    is_mlflow_available,
    is_msamp_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pytest_available,
    is_rich_available,
    is_sagemaker_available,
    is_schedulefree_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_version,
    is_torchao_available,
    is_torchdata_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_tqdm_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_weights_only_available,
    torchao_required,
)
from .compat.memory import clear_device_cache, find_executable_batch_size, release_memory, should_reduce_batch_size
from .compat.operations import (
    CannotPadNestedTensorWarning,
    DistributedOperationException,
    TensorInformation,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_device,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_tensor_information,
    is_torch_tensor,
    listify,
    pad_across_processes,
    pad_input_tensors,
    reduce,
    slice_tensors,
)
from .compat.other import (
    clean_state_dict_for_safetensors,
    convert_bytes,
    extract_model_from_parallel,
    get_current_device_type,
    get_module_children_bottom_up,
    get_pretty_name,
    has_compiled_regions,
    is_peft_model,
    is_port_in_use,
    load,
    merge_dicts,
    merge_fsdp_weights,
    model_has_dtensor,
    recursive_getattr,
    save,
    wait_for_everyone,
)
from .compat.tqdm import tqdm
from .data.loader import skip_first_batches
from .distributed.ops import (
    broadcast,
    broadcast_object_list,
    concatenate,
    find_batch_size,
    gather,
    gather_object,
    is_namedtuple,
    recursively_apply,
    send_to_device,
)
from .distributed.rng import RNGType, synchronize_rng_state, synchronize_rng_states
from .distributed.state import DistributedType
from .precision.base import convert_outputs_to_fp32
from .prepare.wrappers import compile_regions, is_compiled_module
from .settings.config_file import write_basic_config
from .settings.kwargs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .strategies.deepspeed.config import (
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    HfDeepSpeedConfig,
    get_active_deepspeed_plugin,
)
from .strategies.fsdp import FSDPConfig as FullyShardedDataParallelPlugin
from .strategies.fsdp_files import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
from .strategies.parallelism_config import ParallelismConfig, TorchContextParallelConfig, TorchTensorParallelConfig

# Accelerate's file-name constants (`accelerate.utils.constants`), with its values. What accel writes:
# `save_model` writes SAFE_WEIGHTS_NAME, or shards named by SAFE_WEIGHTS_PATTERN_NAME plus
# SAFE_WEIGHTS_INDEX_NAME; `save_state` writes f"{SAFE_MODEL_NAME}.safetensors", f"{OPTIMIZER_NAME}.bin",
# f"{SCHEDULER_NAME}.bin", SCALER_NAME and f"{RNG_STATE_NAME}_{rank}.pt" (Accelerate: .pkl). accel never
# writes the pickle-format names (MODEL_NAME, WEIGHTS_*: `safe_serialization=False` writes "model.bin"),
# SAMPLER_NAME (sampler positions live in "dataloaders.json"); `Accelerator.profile` writes
# PROFILE_PATTERN_NAME's profile_<rank>.json. They are exported as the plain names Accelerate gives them
# (docs/accelerate_compat.md).
SCALER_NAME = "scaler.pt"
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"


def get_gpu_info() -> tuple[list[str], int]:
    """`(names, count)` of the accelerator devices torch sees, as Accelerate's `get_gpu_info`.

    Answered through `torch.accelerator` (whichever device backend is installed, no vendor named);
    `([], 0)` when there is none, where Accelerate's version fails for want of its vendor tool.
    Device names come from the backend's `get_device_name` where it has one, else "<type>:<index>".
    """
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is None:
        return [], 0
    count = torch.accelerator.device_count()
    module = torch.get_device_module(accelerator)
    get_name = getattr(module, "get_device_name", None)
    names = [str(get_name(i)) if callable(get_name) else f"{accelerator.type}:{i}" for i in range(count)]
    return names, count


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy, torch and the adapter's device generators.

    `device_specific` adds the process index so each rank draws differently;
    `deterministic` asks torch for deterministic algorithms.
    """
    from .distributed.state import PartialState, partial_state_exists

    state = PartialState() if partial_state_exists() else None
    if device_specific and state is not None:
        seed += state.process_index
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if state is not None:
        state.adapter.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def __getattr__(name: str) -> Any:
    from .adapter.registry import availability_probe
    from .compat.table import missing_attribute

    probe = availability_probe(name)  # is_<hardware>_available, from the adapters
    if probe is not None:
        return probe

    return missing_attribute("accelerate.utils", name, __name__)


__all__ = [
    "SCALER_NAME",
    "MODEL_NAME",
    "SAFE_MODEL_NAME",
    "RNG_STATE_NAME",
    "OPTIMIZER_NAME",
    "SCHEDULER_NAME",
    "SAMPLER_NAME",
    "PROFILE_PATTERN_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "get_gpu_info",
    "AORecipeKwargs",
    "AutocastKwargs",
    "CannotPadNestedTensorWarning",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "get_active_deepspeed_plugin",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "HfDeepSpeedConfig",
    "DummyScheduler",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchDynamoPlugin",
    "are_libraries_initialized",
    "broadcast",
    "broadcast_object_list",
    "clean_state_dict_for_safetensors",
    "clear_device_cache",
    "clear_environment",
    "compare_versions",
    "compile_regions",
    "concatenate",
    "convert_bytes",
    "convert_dict_to_env_variables",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "copy_tensor_to_devices",
    "deepspeed_required",
    "extract_model_from_parallel",
    "find_batch_size",
    "find_device",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_current_device_type",
    "get_data_structure",
    "get_int_from_env",
    "get_module_children_bottom_up",
    "get_pretty_name",
    "has_compiled_regions",
    "honor_type",
    "ignorant_find_batch_size",
    "initialize_tensors",
    "is_4bit_bnb_available",
    "is_8bit_bnb_available",
    "is_aim_available",
    "is_bf16_available",
    "is_bitsandbytes_multi_backend_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_compiled_module",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp16_available",
    "is_fp8_available",
    "is_import_timer_available",
    "is_lomo_available",
    "is_matplotlib_available",
    "is_megatron_lm_available",
    "is_mlflow_available",
    "is_msamp_available",
    "is_namedtuple",
    "is_pandas_available",
    "is_peft_available",
    "is_peft_model",
    "is_pippy_available",
    "is_port_in_use",
    "is_pytest_available",
    "is_rich_available",
    "is_sagemaker_available",
    "is_schedulefree_available",
    "is_swanlab_available",
    "is_tensor_information",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_tensor",
    "is_torch_version",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_tqdm_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_weights_only_available",
    "listify",
    "load",
    "merge_dicts",
    "merge_fsdp_weights",
    "load_fsdp_model",
    "load_fsdp_optimizer",
    "save_fsdp_model",
    "save_fsdp_optimizer",
    "model_has_dtensor",
    "pad_across_processes",
    "pad_input_tensors",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "recursive_getattr",
    "recursively_apply",
    "reduce",
    "release_memory",
    "save",
    "send_to_device",
    "set_seed",
    "should_reduce_batch_size",
    "skip_first_batches",
    "slice_tensors",
    "str_to_bool",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "torchao_required",
    "tqdm",
    "write_basic_config",
    "wait_for_everyone",
]
