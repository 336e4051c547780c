"""accel: one PyTorch training loop for every accelerator.

    from accel import Accelerator

The hardware is chosen by the installed adapter packages (one per kind of hardware);
without one, the built-in cpu adapter runs on CPUs with gloo.
"""

from .accelerator import Accelerator
from .adapter import ADAPTER_API_VERSION, Adapter, Availability, Capabilities
from .data import DataLoaderShard, skip_first_batches
from .data_samplers import SeedableRandomSampler
from .errors import (
    AccelError,
    AdapterNotFoundError,
    AdapterUnavailableError,
    CheckpointError,
    CollectiveMismatchError,
    DistributedSetupError,
    PrepareError,
    UnsafeCheckpointError,
)
from .handlers import ProfileKwargs
from .imports import is_rich_available
from .kwargs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from .launchers import debug_launcher, notebook_launcher
from .memory import find_executable_batch_size
from .parallelism_config import ParallelismConfig
from .rng import synchronize_rng_states
from .state import AcceleratorState, DistributedType, GradientState, PartialState
from .strategies.deepspeed_config import DeepSpeedPlugin, DummyOptim, DummyScheduler
from .strategies.fsdp import FSDPConfig
from .strategies.fsdp import FSDPConfig as FullyShardedDataParallelPlugin
from .utils import set_seed

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    from .compat_table import missing_attribute

    return missing_attribute("accelerate", name, __name__)


__all__ = [
    "ADAPTER_API_VERSION",
    "AccelError",
    "Accelerator",
    "AcceleratorState",
    "Adapter",
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "AutocastKwargs",
    "Availability",
    "Capabilities",
    "CheckpointError",
    "PrepareError",
    "CollectiveMismatchError",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DataLoaderShard",
    "DistributedDataParallelKwargs",
    "DistributedSetupError",
    "DistributedType",
    "DeepSpeedPlugin",
    "DummyOptim",
    "DummyScheduler",
    "FSDPConfig",
    "FullyShardedDataParallelPlugin",
    "ParallelismConfig",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "SeedableRandomSampler",
    "TorchDynamoPlugin",
    "UnsafeCheckpointError",
    "debug_launcher",
    "find_executable_batch_size",
    "is_rich_available",
    "notebook_launcher",
    "set_seed",
    "skip_first_batches",
    "synchronize_rng_states",
]
