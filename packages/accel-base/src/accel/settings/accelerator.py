"""`AcceleratorSettings`: everything an `Accelerator` is built from, decided before anything is built.

`accel.compat.arguments.accelerator_settings` makes one from the `Accelerator`'s arguments (Accelerate's
objects converted, deprecated spellings turned into their replacements), the environment and the
launcher's defaults; `Accelerator.__init__` then builds the state, the strategy, the precision and the
trackers from it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..precision.fp8_request import NO_FP8_REQUEST, FP8Request
from .env import EnvSettings
from .kwargs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProjectConfiguration,
    TorchDynamoPlugin,
)

if TYPE_CHECKING:
    from ..strategies.parallelism_config import ParallelismConfig


class _Default(int):
    """An int default that tells "left out" (this very object) from the same number passed in code."""

    def __repr__(self) -> str:
        return int.__repr__(self)


DEFAULT_GRADIENT_ACCUMULATION_STEPS: int = _Default(1)
"""`Accelerator(gradient_accumulation_steps=)`'s default, 1: only a value passed in code wins over the launcher's."""


def install_marker_default(function: Callable[..., Any], name: str, marker: int) -> None:
    """Make `marker` the default of `function`'s parameter `name`, whose source default is the same number.

    The source keeps the plain number (what the API reference and `help` show); calls that leave the
    argument out get this very object, which `is` tells apart from the number passed in code.
    """
    code = function.__code__
    names = code.co_varnames[: code.co_argcount]
    defaults = list(function.__defaults__ or ())
    index = names.index(name) - (len(names) - len(defaults))
    if index < 0 or defaults[index] != marker:
        raise TypeError(f"{function.__qualname__}'s parameter {name} has no default equal to {marker!r}")
    defaults[index] = marker
    function.__defaults__ = tuple(defaults)


@dataclass(kw_only=True, frozen=True)
class AcceleratorSettings:
    """An `Accelerator`'s arguments after translation, with the environment and the launcher's defaults applied."""

    env: EnvSettings
    """The environment, read once (after `accelerate launch`'s variables became accel's)."""
    mixed_precision: str | None
    """The precision asked for; None: `env.mixed_precision`, else "no" (checked against the adapter later)."""
    cpu: bool
    """Force the built-in cpu adapter."""
    adapter: str | None
    """The adapter asked for; None: `env.adapter`, else the best available one."""
    adapter_options: Mapping[str, Any] | None
    """The adapter's own options by field name; they win over its flags and variables."""
    emulate: bool | None
    """Run the adapter's code on the CPU with gloo; None: `env.emulate`."""
    strategy: str | None
    """The strategy's name (a plugin's, the argument's, the launcher's); None: `env.strategy`, else the adapter's
    default."""
    strategy_config: Any
    """The strategy's config (an FSDP/DeepSpeed/Megatron plugin, `strategy_config=`, or the launcher's)."""
    parallelism_config: ParallelismConfig | None
    """The N-D mesh sizes (the argument, the deprecated `torch_tp_plugin`'s, or the launcher's)."""
    torch_tp_plugin: Any
    """The deprecated `TorchTensorParallelPlugin` as given, for `AcceleratorState.torch_tp_plugin`."""
    handlers: Mapping[type, Any]
    """The kwargs handlers by class (at most one each)."""
    fp8: FP8Request = NO_FP8_REQUEST
    """The fp8 recipe asked for (recipe handlers, then the launcher's `ACCEL_FP8_*`), for the adapter's precision."""
    project_config: ProjectConfiguration
    """Where checkpoints and logs go."""
    dataloader_config: DataLoaderConfiguration
    """How loaders are sharded (with `split_batches=` / `even_batches=` applied)."""
    dynamo_plugin: TorchDynamoPlugin
    """How prepared models are compiled (`dynamo_backend=`, the launcher's `ACCEL_DYNAMO_*`, or none)."""
    gradient_accumulation_plugin: GradientAccumulationPlugin
    """Micro-batches per optimizer step (`gradient_accumulation_steps=` or the environment's, checked)."""
    device_placement: bool
    """Move prepared models and batches to the device."""
    step_scheduler_with_optimizer: bool
    """Step prepared schedulers only with real optimizer steps."""
    rng_types: list[str]
    """The generators copied from rank 0 at every iteration of a prepared loader."""
    log_with: Any
    """The trackers (names or objects), as given."""

    @property
    def ddp_handler(self) -> DistributedDataParallelKwargs | None:
        """The `DistributedDataParallelKwargs` given, if any."""
        return self.handlers.get(DistributedDataParallelKwargs)

    @property
    def scaler_handler(self) -> GradScalerKwargs | None:
        """The `GradScalerKwargs` given, if any."""
        return self.handlers.get(GradScalerKwargs)

    @property
    def init_handler(self) -> InitProcessGroupKwargs | None:
        """The `InitProcessGroupKwargs` given, if any."""
        return self.handlers.get(InitProcessGroupKwargs)

    @property
    def autocast_handler(self) -> AutocastKwargs | None:
        """The `AutocastKwargs` given, if any."""
        return self.handlers.get(AutocastKwargs)
