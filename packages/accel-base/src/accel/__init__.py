"""accel: one PyTorch training loop for every accelerator.

    from accel import Accelerator

The hardware is chosen by the installed adapter packages (one per kind of hardware);
without one, the built-in cpu adapter runs on CPUs with gloo.
"""

from .accelerator import Accelerator
from .adapter.base import ADAPTER_API_VERSION, Adapter, Availability, Capabilities
from .compat import moved as _moved  # noqa: F401  (old flat module paths still import, with a warning)
from .compat.env import apply_accelerate_env as _apply_accelerate_env
from .compat.handlers import ProfileKwargs
from .compat.imports import is_rich_available
from .compat.memory import find_executable_batch_size
from .compat.table import missing_member as _missing_member
from .data.loader import DataLoaderShard, skip_first_batches
from .data.samplers import SeedableRandomSampler
from .distributed.rng import synchronize_rng_states
from .distributed.state import AcceleratorState, DistributedType, GradientState, PartialState
from .distributed.state import register_edge as _register_edge
from .errors import (
    AccelError,
    AdapterNotFoundError,
    AdapterUnavailableError,
    CheckpointError,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    DistributedSetupError,
    PrepareError,
    UnsafeCheckpointError,
)
from .launchers import debug_launcher, notebook_launcher
from .settings.kwargs import (
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
from .strategies.deepspeed.config import DeepSpeedPlugin, DummyOptim, DummyScheduler
from .strategies.fsdp import FSDPConfig
from .strategies.fsdp import FSDPConfig as FullyShardedDataParallelPlugin
from .strategies.parallelism_config import ParallelismConfig
from .utils import set_seed

__version__ = "0.1.0"

# The engine never imports compat/: a state reads the environment after Accelerate's variables are translated
# into accel's, and explains a missing Accelerate member, through these hooks. Every `import accel.x` runs this.
_register_edge(before=_apply_accelerate_env, missing=_missing_member)


def __getattr__(name: str) -> object:
    from .compat.table import missing_attribute

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
    "CollectiveTimeoutError",
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
