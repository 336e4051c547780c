"""Experiment trackers: a registry of names, only the main process writes.

Built in: "jsonl" (one JSON object per `log` call in `<logging_dir>/<project>/metrics.jsonl`)
and "tensorboard" (event files through `torch.utils.tensorboard`); Accelerate's others
("wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "trackio", "swanlab") are in
`accel.tracking`. Another tracker is one `register_tracker` call, not an edit of the Accelerator.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar

from .base import GeneralTracker, JSONLTracker, TensorBoardTracker
from .libraries import LOGGER_TYPE_TO_CLASS, get_available_trackers

# Built in, then Accelerate's trackers under its names.
# Tracker classes by name; `Any`: Accelerate's contract puts `name` and `requires_logging_directory`
# on the subclasses, not on GeneralTracker.
_TRACKERS: dict[str, Any] = {
    "jsonl": JSONLTracker,
    "tensorboard": TensorBoardTracker,
    **LOGGER_TYPE_TO_CLASS,
}


def register_tracker(cls: Any) -> Any:
    """Make a tracker class available to `log_with` under `cls.name` (usable as a decorator)."""
    _TRACKERS[cls.name] = cls
    return cls


_TRACKER_INTERFACE = ("name", "log", "store_init_configuration", "finish")


def is_tracker_instance(item: Any) -> bool:
    """Whether `item` is a tracker object: a `GeneralTracker`, or one with its interface (e.g. built with Accelerate)."""
    if isinstance(item, GeneralTracker):
        return True
    return not isinstance(item, (str, type)) and all(hasattr(item, attr) for attr in _TRACKER_INTERFACE)


class TrackerHub:
    """The trackers one Accelerator logs to.

    `log_with` items are tracker names (registered, or Accelerate's) or tracker objects:
    accel `GeneralTracker` subclasses, or objects with the same interface (`name`, `log`,
    `store_init_configuration`, `finish`; `start` and `tracker` when they have them), which
    covers trackers subclassed from the real `accelerate.tracking.GeneralTracker`.

    Raises:
        ValueError: an unknown tracker name.
        TypeError: an item that is neither a name nor a tracker object.
    """

    def __init__(
        self,
        log_with: Any,
        logging_dir: str | None,
        *,
        is_main_process: bool,
        adopt: Callable[[Any], Any] | None = None,
    ) -> None:
        """`adopt`: how an item that is not a name becomes a tracker (the Accelerator passes Accelerate's
        rule, `accel.compat.objects.adopt_tracker`); None takes the object as it is."""
        if log_with is None:
            log_with = []
        elif isinstance(log_with, str) or not isinstance(log_with, (list, tuple)):
            log_with = [log_with]
        # An enum member names a tracker by its value (accel's or Accelerate's `LoggerType`).
        log_with = [
            item.value if isinstance(item, enum.Enum) and isinstance(item.value, str) else item for item in log_with
        ]
        log_with = [item if isinstance(item, str) or adopt is None else adopt(item) for item in log_with]
        if "all" in log_with:
            # Every registered tracker, except Accelerate's whose package is not installed.
            available = set(get_available_trackers())
            log_with = [name for name in _TRACKERS if name not in LOGGER_TYPE_TO_CLASS or name in available]
        for item in log_with:
            if isinstance(item, str):
                if item not in _TRACKERS:
                    raise ValueError(
                        f"Unknown tracker {item!r}. Known trackers: {sorted(_TRACKERS)}; "
                        "add one with `register_tracker`."
                    )
            elif not is_tracker_instance(item):
                raise TypeError(
                    f"log_with: {item!r} is neither a tracker name nor a tracker object. Pass a name "
                    f"({sorted(_TRACKERS)}) or an instance of an `accel.tracking.GeneralTracker` subclass."
                )
        self.requested = list(log_with)
        self.logging_dir = logging_dir
        self.is_main_process = is_main_process
        self.active: list[Any] = []

    def init(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, Any]) -> None:
        """Build the named trackers as Accelerate does, `start()` every tracker, then store `config` (main process)."""
        if not self.is_main_process:
            return
        trackers: list[Any] = []
        for item in self.requested:
            if not isinstance(item, str):
                trackers.append(item)
                continue
            cls = _TRACKERS[item]
            kwargs = init_kwargs.get(str(item), {})
            if cls.requires_logging_directory:
                trackers.append(cls(project_name, self.logging_dir or ".", **kwargs))
            else:
                trackers.append(cls(project_name, **kwargs))
        for tracker in trackers:
            if hasattr(tracker, "start"):
                tracker.start()
        if config is not None:
            for tracker in trackers:
                tracker.store_init_configuration(config)
        self.active.extend(trackers)

    def log(self, values: dict[str, Any], step: int | None, log_kwargs: dict[str, Any]) -> None:
        for tracker in self.active:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def get(self, name: str, unwrap: bool = False) -> Any:
        for tracker in self.active:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        return _NullTracker()

    def finish(self) -> None:
        for tracker in self.active:
            tracker.finish()
        self.active = []


class _NullTracker(GeneralTracker):
    """Returned by `get_tracker` on processes that do not log: every call does nothing."""

    name: ClassVar[str] = "null"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__(_blank=True)

    @property
    def tracker(self) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
