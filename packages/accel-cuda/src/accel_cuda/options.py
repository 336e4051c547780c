"""The CUDA adapter's settings: the TF32 kwargs handler and the data-loader options.

`CUDAOptions` is filled once from the `ACCEL_CUDA_*` variables when the adapter starts
(`accel.adapter.options` parses them); nothing deeper reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accel.adapter.options import AdapterOptions, option
from accel.settings.kwargs import KwargsHandler


@dataclass(kw_only=True)
class TF32Kwargs(KwargsHandler):
    """TensorFloat-32 switches, applied by the CUDA adapter at `prepare`.

    TF32 runs fp32 matmuls and convolutions on tensor cores with a 10-bit mantissa: several
    times faster on Ampere and newer, with about 1e-3 relative error. Without this handler
    PyTorch's defaults stand (matmul off, cuDNN convolutions on).
    """

    matmul: bool = True
    """`torch.backends.cuda.matmul.allow_tf32`."""
    cudnn: bool = True
    """`torch.backends.cudnn.allow_tf32`."""


@dataclass(kw_only=True, frozen=True)
class CUDAOptions(AdapterOptions):
    """How the CUDA adapter prepares data loaders. Each field has an `ACCEL_CUDA_*` variable."""

    label: ClassVar[str] = "CUDA"

    pin_memory: bool = option(True, env="ACCEL_CUDA_PIN_MEMORY")
    """Prepared data loaders pin host batches in page-locked memory (when the runtime can), so
    copies to the GPU run by DMA. Costs page-locked host RAM per in-flight batch."""
    non_blocking: bool = option(True, env="ACCEL_CUDA_NON_BLOCKING")
    """Copy pinned batches to the GPU asynchronously: the copy overlaps the previous step's
    kernels. Applies only when batches are pinned (an unpinned non-blocking copy is synchronous)."""
