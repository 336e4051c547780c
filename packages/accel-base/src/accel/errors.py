"""Exception types. Each says what went wrong and what to do next."""

from __future__ import annotations


class AccelError(Exception):
    """Base class of accel's own errors."""


class AdapterNotFoundError(AccelError, ValueError):
    """No installed adapter has the requested name, or it failed to load."""


class StrategyNotFoundError(AccelError, ValueError):
    """No installed strategy has the requested name, or it failed to load."""


class StrategyNotSupportedError(AccelError, ValueError):
    """The selected adapter does not support the requested strategy (`Capabilities.strategies`)."""


class CompileNotSupportedError(AccelError, ValueError):
    """The selected adapter does not run `torch.compile`, or not with the backend asked for
    (`Capabilities.compile`, `Adapter.compile_backends`)."""


class AdapterUnavailableError(AccelError, RuntimeError):
    """The requested adapter is installed but its hardware is not present."""


class DistributedSetupError(AccelError, RuntimeError):
    """The process group could not be formed from what the launcher provided."""


class CollectiveMismatchError(AccelError, ValueError):
    """Ranks passed tensors of different shapes or dtypes to one collective (debug mode)."""


class CollectiveTimeoutError(AccelError, RuntimeError):
    """A collective waited out the process group's timeout: the message names the operation, its call site and
    the ranks that never arrived (`accel.distributed.watchdog`). A `RuntimeError`, as the backend's timeout is."""


class CheckpointError(AccelError, RuntimeError):
    """A checkpoint is missing, incomplete, corrupted or unsafe to load."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds objects that loading would have to execute code to rebuild."""


class PrepareError(AccelError, ValueError):
    """`prepare` cannot carry an object over as given (e.g. optimizer state for parameters it replaced)."""


class UnsupportedHandlerError(AccelError, TypeError, AssertionError):
    """Something that is not a kwargs handler was passed in `kwargs_handlers`. Also an `AssertionError`,
    the type Accelerate raises there, so code written against either library catches it."""


class FP8RecipeError(AccelError, ValueError):
    """An fp8 recipe setting (a recipe handler's field, an `ACCEL_FP8_*` variable) the run's fp8 backend cannot
    honour; the message names the setting and why."""


class SettingError(AccelError, ValueError):
    """A setting (launch flag, config key or environment variable; Accelerate's or accel's) accel cannot
    honour; the message starts with the setting's name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
