"""accel: one PyTorch training loop for every accelerator.

    from accel import Accelerator

The hardware is chosen by the installed adapter packages (one per kind of hardware);
without one, the built-in cpu adapter runs on CPUs with gloo.

The public names load on first use (`accel.Accelerator` imports the engine then): `accel launch`,
`accel config` and the other commands import only what they need, so a launch costs what torchrun's does.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from .compat import moved as _moved  # noqa: F401  (old flat module paths still import, with a warning)
from .compat.env import apply_accelerate_env as _apply_accelerate_env
from .compat.table import missing_member as _missing_member
from .distributed.edge import register_edge as _register_edge
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

if TYPE_CHECKING:
    from .accelerator import Accelerator
    from .adapter.base import ADAPTER_API_VERSION, Adapter, Availability, Capabilities
    from .compat.handlers import ProfileKwargs
    from .compat.imports import is_rich_available
    from .compat.memory import find_executable_batch_size
    from .data.loader import DataLoaderShard, skip_first_batches
    from .data.samplers import SeedableRandomSampler
    from .distributed.rng import synchronize_rng_states
    from .distributed.state import AcceleratorState, DistributedType, GradientState, PartialState
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

# Where each public name lives: `accel.NAME` imports its module on first use (PEP 562).
_LAZY = {
    "Accelerator": (".accelerator", "Accelerator"),
    "ADAPTER_API_VERSION": (".adapter.base", "ADAPTER_API_VERSION"),
    "Adapter": (".adapter.base", "Adapter"),
    "Availability": (".adapter.base", "Availability"),
    "Capabilities": (".adapter.base", "Capabilities"),
    "ProfileKwargs": (".compat.handlers", "ProfileKwargs"),
    "is_rich_available": (".compat.imports", "is_rich_available"),
    "find_executable_batch_size": (".compat.memory", "find_executable_batch_size"),
    "DataLoaderShard": (".data.loader", "DataLoaderShard"),
    "skip_first_batches": (".data.loader", "skip_first_batches"),
    "SeedableRandomSampler": (".data.samplers", "SeedableRandomSampler"),
    "synchronize_rng_states": (".distributed.rng", "synchronize_rng_states"),
    "AcceleratorState": (".distributed.state", "AcceleratorState"),
    "DistributedType": (".distributed.state", "DistributedType"),
    "GradientState": (".distributed.state", "GradientState"),
    "PartialState": (".distributed.state", "PartialState"),
    "debug_launcher": (".launchers", "debug_launcher"),
    "notebook_launcher": (".launchers", "notebook_launcher"),
    "AutocastKwargs": (".settings.kwargs", "AutocastKwargs"),
    "DataLoaderConfiguration": (".settings.kwargs", "DataLoaderConfiguration"),
    "DDPCommunicationHookType": (".settings.kwargs", "DDPCommunicationHookType"),
    "DistributedDataParallelKwargs": (".settings.kwargs", "DistributedDataParallelKwargs"),
    "GradientAccumulationPlugin": (".settings.kwargs", "GradientAccumulationPlugin"),
    "GradScalerKwargs": (".settings.kwargs", "GradScalerKwargs"),
    "InitProcessGroupKwargs": (".settings.kwargs", "InitProcessGroupKwargs"),
    "ProjectConfiguration": (".settings.kwargs", "ProjectConfiguration"),
    "TorchDynamoPlugin": (".settings.kwargs", "TorchDynamoPlugin"),
    "DeepSpeedPlugin": (".strategies.deepspeed.config", "DeepSpeedPlugin"),
    "DummyOptim": (".strategies.deepspeed.config", "DummyOptim"),
    "DummyScheduler": (".strategies.deepspeed.config", "DummyScheduler"),
    "FSDPConfig": (".strategies.fsdp", "FSDPConfig"),
    "FullyShardedDataParallelPlugin": (".strategies.fsdp", "FSDPConfig"),
    "ParallelismConfig": (".strategies.parallelism_config", "ParallelismConfig"),
    "set_seed": (".utils", "set_seed"),
}

# The engine never imports compat/: a state reads the environment after Accelerate's variables are translated
# into accel's, and explains a missing Accelerate member, through these hooks. Every `import accel.x` runs this.
_register_edge(before=_apply_accelerate_env, missing=_missing_member)


def __getattr__(name: str) -> object:
    """`accel.NAME`: a public name (imported on first use), a submodule, or Accelerate's reason it is absent."""
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attribute)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)  # `accel.utils` after a bare `import accel`
    from .compat.table import missing_attribute

    return missing_attribute("accelerate", name, __name__)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
