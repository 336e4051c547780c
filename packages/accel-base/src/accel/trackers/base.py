"""The tracker base class and the two trackers built in: "jsonl" and "tensorboard".

The registry of names (`accel.trackers`) and Accelerate's trackers
(`accel.trackers.libraries`) build on this module. The contract is Accelerate's: a tracker
is constructed cheaply on every process (`__init__`), its library is started by `start()`
(called by `init_trackers` on the main process), then `store_init_configuration`, `log`
and `finish`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar


class GeneralTracker:
    """Base class of trackers, with Accelerate's contract.

    A subclass defines the class attributes `name` (what `log_with=` and `get_tracker` call
    it) and `requires_logging_directory` (whether it is built as `cls(project_name,
    logging_dir, **init_kwargs)` rather than `cls(project_name, **init_kwargs)`), a `tracker`
    property (the library's own object), and overrides `start`, `store_init_configuration`,
    `log` and `finish`. `main_process_only` (default True) makes the methods decorated with
    `accel.tracking.on_main_process` run on the main process only.

    Args:
        _blank: skip the check that `name`, `requires_logging_directory` and `tracker` are
            defined (for internal placeholders).

    Raises:
        NotImplementedError: a subclass lacks one of `name`, `requires_logging_directory`, `tracker`.
    """

    main_process_only: ClassVar[bool] = True

    def __init__(self, _blank: bool = False) -> None:
        if _blank:
            return
        missing = [f"`{attr}`" for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        # `tracker` is usually a property reading what `start` creates: look it up on the class.
        if "tracker" not in dir(self):
            missing.append("`tracker`")
        if missing:
            raise NotImplementedError(
                "The implementation for this tracker class is missing the following required attributes. "
                f"Please define them in the class definition: {', '.join(missing)}"
            )

    def start(self) -> None:
        """Start the library's run (called by `init_trackers`, main process only). Does nothing here."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record `values` as the run's hyperparameters. Does nothing here."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record `values` at `step`. Does nothing here."""

    def finish(self) -> None:
        """Close the run. Does nothing here."""


class JSONLTracker(GeneralTracker):
    """Appends `{"step": ..., "time": ..., **values}` lines to `<logging_dir>/<run_name>/metrics.jsonl`.

    Args:
        run_name: the project name given to `init_trackers`.
        logging_dir: the parent directory (default: the current directory).
    """

    name: ClassVar[str] = "jsonl"
    requires_logging_directory: ClassVar[bool] = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = logging_dir
        self.dir = Path(logging_dir or ".") / run_name
        self.path = self.dir / "metrics.jsonl"
        self._file: Any = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    @property
    def tracker(self) -> Any:
        return self._file

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.json").write_text(json.dumps(values, indent=2, default=str))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self._file is None:
            self.start()
        row = {"step": step, "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardTracker(GeneralTracker):
    """TensorBoard event files under `<logging_dir>/<run_name>`, as Accelerate's `TensorBoardTracker`.

    Numbers go to `add_scalar`, strings to `add_text`, dicts of numbers to `add_scalars`;
    `store_init_configuration` writes `add_hparams` (TensorBoard's HParams tab) and a
    `hparams.yml` under `<logging_dir>/<run_name>/<timestamp>/`.

    Args:
        run_name: the project name given to `init_trackers`.
        logging_dir: the parent directory of the run's event files.
        **kwargs: passed to `SummaryWriter` (e.g. `flush_secs`).
    """

    name: ClassVar[str] = "tensorboard"
    requires_logging_directory: ClassVar[bool] = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir_param = logging_dir
        self.init_kwargs = kwargs
        self.logging_dir = os.path.join(logging_dir if logging_dir is not None else ".", run_name)
        self.writer: Any = None

    def start(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                'The tensorboard tracker needs the `tensorboard` package: pip install "accel-base[tensorboard]"'
            ) from exc
        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """The run's hyperparameters: TensorBoard's HParams (`add_hparams`) and `<timestamp>/hparams.yml`.

        Raises:
            yaml.representer.RepresenterError: a value YAML cannot write (use bool, str, int, float or None).
        """
        import yaml

        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()
        directory = os.path.join(self.logging_dir, str(time.time()))
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hparams.yml"), "w", encoding="utf-8") as outfile:
            yaml.dump(values, outfile)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, {k: _plain(v) for k, v in value.items()}, global_step=step, **kwargs)
            else:
                self.writer.add_scalar(key, _plain(value), global_step=step, **kwargs)
        self.writer.flush()

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """`add_images` for each key (values: batches of images as arrays or tensors)."""
        for key, value in values.items():
            self.writer.add_images(key, value, global_step=step, **kwargs)

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
