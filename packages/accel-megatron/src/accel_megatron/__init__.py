"""accel-megatron: megatron-core tensor and pipeline parallelism behind `accel.Accelerator`."""

from .data import MegatronLMDummyDataLoader
from .engine import AbstractTrainStep, MegatronEngine
from .hf import GPTTrainStep
from .optim import MegatronLMDummyScheduler
from .parallel import ModelChunks, ModelProvider
from .plugin import MegatronConfigError, MegatronPlugin
from .strategy import MegatronStrategy
from .utils import avg_losses_across_data_parallel_group, gather_across_data_parallel_groups

__all__ = [
    "AbstractTrainStep",
    "GPTTrainStep",
    "MegatronConfigError",
    "MegatronEngine",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronPlugin",
    "MegatronStrategy",
    "ModelChunks",
    "ModelProvider",
    "avg_losses_across_data_parallel_group",
    "gather_across_data_parallel_groups",
]
