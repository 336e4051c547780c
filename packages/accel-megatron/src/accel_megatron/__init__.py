"""accel-megatron: megatron-core tensor and pipeline parallelism behind `accel.Accelerator`."""

from .data import MegatronLMDummyDataLoader
from .optim import MegatronLMDummyScheduler
from .parallel import ModelChunks, ModelProvider
from .plugin import MegatronConfigError, MegatronPlugin
from .strategy import MegatronStrategy

__all__ = [
    "MegatronConfigError",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronPlugin",
    "MegatronStrategy",
    "ModelChunks",
    "ModelProvider",
]
