"""accel-cuda: the NVIDIA GPU adapter for accel.

Installed, it registers the `cuda` adapter in the `accel.adapter` entry-point group; it is
chosen first whenever PyTorch sees a CUDA device. Without one it runs emulated on the CPU
(`ACCEL_EMULATE=1`).
"""

from .adapter import CUDAAdapter, P2PUnsupportedError
from .fp8 import AORecipeKwargs, FP8BackendError, TERecipeKwargs
from .options import CUDAOptions, TF32Kwargs

__version__ = "0.1.0"

__all__ = [
    "AORecipeKwargs",
    "CUDAAdapter",
    "CUDAOptions",
    "FP8BackendError",
    "P2PUnsupportedError",
    "TERecipeKwargs",
    "TF32Kwargs",
    "__version__",
]
