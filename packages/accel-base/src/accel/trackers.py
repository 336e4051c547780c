"""Experiment trackers: a registry of names, only the main process writes.

Built in: "jsonl" (one JSON object per `log` call in `<logging_dir>/<project>/metrics.jsonl`)
and "tensorboard" (event files through `torch.utils.tensorboard`); Accelerate's others
("wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "trackio", "swanlab") are in
`accel.tracking`. Another tracker is one `register_tracker` call, not an edit of the Accelerator.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .tracker_base import GeneralTracker, JSONLTracker, TensorBoardTracker
from .tracker_libraries import LOGGER_TYPE_TO_CLASS, get_available_trackers

# Built in, then Accelerate's trackers under its names.
_TRACKERS: dict[str, type[GeneralTracker]] = {
    "jsonl": JSONLTracker,
    "tensorboard": TensorBoardTracker,
    **LOGGER_TYPE_TO_CLASS,
}


def register_tracker(cls: type[GeneralTracker]) -> type[GeneralTracker]:
    """Make a tracker class available to `log_with` under `cls.name` (usable as a decorator)."""
    _TRACKERS[cls.name] = cls
    return cls


class TrackerHub:
    """The trackers one Accelerator logs to."""

    def __init__(self, log_with: Any, logging_dir: str | None, *, is_main_process: bool) -> None:
        if log_with is None:
            log_with = []
        elif isinstance(log_with, (str, GeneralTracker)):
            log_with = [log_with]
        if "all" in log_with:
            # Every registered tracker, except Accelerate's whose package is not installed.
            available = set(get_available_trackers())
            log_with = [name for name in _TRACKERS if name not in LOGGER_TYPE_TO_CLASS or name in available]
        for item in log_with:
            if isinstance(item, str) and item not in _TRACKERS:
                raise ValueError(
                    f"Unknown tracker {item!r}. Known trackers: {sorted(_TRACKERS)}; add one with `register_tracker`."
                )
        self.requested = list(log_with)
        self.logging_dir = logging_dir
        self.is_main_process = is_main_process
        self.active: list[GeneralTracker] = []

    def init(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, Any]) -> None:
        if not self.is_main_process:
            return
        for item in self.requested:
            if isinstance(item, GeneralTracker):
                tracker = item
            else:
                tracker = _TRACKERS[item](project_name, self.logging_dir, **init_kwargs.get(item, {}))
            if config is not None:
                tracker.store_init_configuration(config)
            self.active.append(tracker)

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

    def __init__(self) -> None:
        super().__init__("null")

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
