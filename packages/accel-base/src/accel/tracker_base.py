"""The tracker base class and the two trackers built in: "jsonl" and "tensorboard".

The registry of names (`accel.trackers`) and Accelerate's trackers
(`accel.tracker_libraries`) build on this module.
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


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
