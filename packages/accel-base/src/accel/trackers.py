"""Experiment trackers: a registry of names, only the main process writes.

Built in: "jsonl" (one JSON object per `log` call in `<logging_dir>/<project>/metrics.jsonl`)
and "tensorboard" (event files through `torch.utils.tensorboard`); the peer library's others
("wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "trackio", "swanlab") are in
`accel.tracking`. Another tracker is one `register_tracker` call, not an edit of the Accelerator.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar


class GeneralTracker:
    """Base class of trackers: `store_init_configuration`, `log`, `finish`, and `tracker` (the raw object)."""

    name: ClassVar[str] = "base"
    requires_logging_directory: ClassVar[bool] = True

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        self.run_name = run_name
        self.logging_dir = logging_dir

    @property
    def tracker(self) -> Any:
        return self

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        pass

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


class JSONLTracker(GeneralTracker):
    """Appends `{"step": ..., "time": ..., **values}` lines to `metrics.jsonl`."""

    name: ClassVar[str] = "jsonl"

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        self.dir = Path(logging_dir or ".") / run_name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        (self.dir / "config.json").write_text(json.dumps(values, indent=2, default=str))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


class TensorBoardTracker(GeneralTracker):
    """Scalars (and strings as text) to TensorBoard event files under `<logging_dir>/<run_name>`."""

    name: ClassVar[str] = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "The tensorboard tracker needs `pip install tensorboard` (or accel-base[tensorboard])."
            ) from exc
        self.writer = SummaryWriter(str(Path(logging_dir or ".") / run_name), **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.add_text("config", json.dumps(values, indent=2, default=str))
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, {k: _plain(v) for k, v in value.items()}, global_step=step)
            else:
                self.writer.add_scalar(key, _plain(value), global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


_TRACKERS: dict[str, type[GeneralTracker]] = {"jsonl": JSONLTracker, "tensorboard": TensorBoardTracker}


def register_tracker(cls: type[GeneralTracker]) -> type[GeneralTracker]:
    """Make a tracker class available to `log_with` under `cls.name` (usable as a decorator)."""
    _TRACKERS[cls.name] = cls
    return cls


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


class TrackerHub:
    """The trackers one Accelerator logs to."""

    def __init__(self, log_with: Any, logging_dir: str | None, *, is_main_process: bool) -> None:
        if log_with is None:
            log_with = []
        elif isinstance(log_with, (str, GeneralTracker)):
            log_with = [log_with]
        if "all" in log_with:
            from .tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

            # Every registered tracker, except the peer library's whose package is not installed.
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


# The third-party trackers register themselves under the peer library's names.
from . import tracking as _tracking  # noqa: E402, F401
