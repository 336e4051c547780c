"""accel-megatron: megatron-core tensor and pipeline parallelism behind `accel.Accelerator`."""

from .parallel import ModelChunks, ModelProvider
from .plugin import MegatronConfigError, MegatronPlugin
from .strategy import MegatronStrategy

__all__ = ["MegatronConfigError", "MegatronPlugin", "MegatronStrategy", "ModelChunks", "ModelProvider"]
