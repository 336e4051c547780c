"""accel-xla: the torch_xla (TPU) adapter for accel.

Installed, it registers the `xla` adapter in the `accel.adapter` entry-point group and its
data-parallel strategy `xla_ddp` (the adapter's default), torch_xla's SPMD FSDP strategy
`xla_fsdp_v2` (settings: `XLAFSDPv2Config`) and `xla_fsdp` (torch_xla's FSDPv1, refused with the reason)
in `accel.strategies`. It
runs on TPUs, on torch_xla's CPU device (`PJRT_DEVICE=CPU`), and emulated on the CPU with
gloo (`ACCEL_EMULATE=1`) where torch_xla is not installed.
"""

from .adapter import XLAAdapter
from .xla_ddp import XLADataParallelStrategy
from .xla_fsdp_v2 import XLAFSDPv2Config, XLAFSDPv2Strategy

__version__ = "0.1.0"

__all__ = ["XLAAdapter", "XLADataParallelStrategy", "XLAFSDPv2Config", "XLAFSDPv2Strategy", "__version__"]
