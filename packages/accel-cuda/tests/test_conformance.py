"""The accel conformance kit against the CUDA adapter: on the GPUs with NCCL when there are
any, emulated on the CPU (2 gloo processes) where there are none.

With one GPU the kit runs one process (NCCL cannot put two ranks on one GPU); the
multi-process checks then run as their world-size-1 case, and CPU CI covers 2 ranks.
"""

import torch
from accel.testing import AdapterConformanceSuite

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


class TestCUDAConformance(AdapterConformanceSuite):
    adapter = "cuda"
    processes = 1 if GPUS == 1 else None
    distributed_type = "MULTI_GPU"  # Accelerate's name for CUDA's data parallelism (not MULTI_CUDA)
