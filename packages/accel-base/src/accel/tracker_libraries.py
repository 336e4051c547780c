"""Accelerate's third-party trackers (wandb, mlflow, comet_ml, aim, clearml, dvclive, trackio, swanlab).

Each wraps its library, imported when the tracker starts. `accel.trackers` registers them
under their names; `accel.tracking` is the module path Accelerate's users import them from.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

from . import imports
from .tracker_base import GeneralTracker, TensorBoardTracker


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for tracker methods: run only on the main process when the tracker's `main_process_only` is set."""

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from .state import PartialState

        if getattr(self, "main_process_only", False) and not PartialState().is_main_process:
            return None
        return function(self, *args, **kwargs)

    return wrapper


def _library(module: str, extra: str, tracker: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f'The {tracker} tracker needs the `{module}` package: pip install "accel-base[{extra}]"'
        ) from exc


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}


class WandBTracker(GeneralTracker):
    """Weights & Biases: `wandb.init(project=run_name, **kwargs)` (offline with `WANDB_MODE=offline`)."""

    name: ClassVar[str] = "wandb"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        wandb = _library("wandb", "wandb", "wandb")
        self.run = wandb.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(_scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """MLflow: an experiment named `run_name` (or `MLFLOW_EXPERIMENT_NAME`) in the tracking store
    (`MLFLOW_TRACKING_URI`, e.g. a `file:` directory), one run per `init_trackers`."""

    name: ClassVar[str] = "mlflow"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(
        self,
        run_name: str | None = None,
        logging_dir: str | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        nested_run: bool = False,
        description: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(run_name or "accel", logging_dir)
        mlflow = _library("mlflow", "mlflow", "mlflow")
        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", run_name)
        found = mlflow.get_experiment_by_name(experiment_name)
        experiment_id = (
            found.experiment_id
            if found is not None
            else mlflow.create_experiment(experiment_name, artifact_location=logging_dir, tags=tags)
        )
        self.run = mlflow.start_run(
            run_id=os.environ.get("MLFLOW_RUN_ID", run_id),
            experiment_id=experiment_id,
            run_name=kwargs.pop("mlflow_run_name", None),
            nested=nested_run,
            tags=tags,
            description=description,
        )
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # MLflow caps parameter values at 500 characters.
        self._mlflow.log_params({k: str(v)[:500] for k, v in values.items()})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {k: v for k, v in _scalars(values).items() if isinstance(v, (int, float))}
        self._mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


class CometMLTracker(GeneralTracker):
    """Comet: `comet_ml.start(project_name=run_name, **kwargs)` (offline with `online=False`)."""

    name: ClassVar[str] = "comet_ml"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        comet_ml = _library("comet_ml", "comet_ml", "comet_ml")
        self.writer = comet_ml.start(project_name=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.writer.log_metrics(_scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        self.writer.end()


class AimTracker(GeneralTracker):
    """Aim: a run in the local repository `logging_dir` (default ".")."""

    name: ClassVar[str] = "aim"
    requires_logging_directory: ClassVar[bool] = True

    def __init__(self, run_name: str, logging_dir: str | None = ".", **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        aim = _library("aim", "aim", "aim")
        self.writer = aim.Run(repo=str(logging_dir or "."), **kwargs)
        self.writer.name = run_name

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in _scalars(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    def finish(self) -> None:
        self.writer.close()


class ClearMLTracker(GeneralTracker):
    """ClearML: `Task.init(project_name=run_name, **kwargs)` (offline with `CLEARML_OFFLINE_MODE=1`)."""

    name: ClassVar[str] = "clearml"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str | None = None, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name or "accel", logging_dir)
        clearml = _library("clearml", "clearml", "clearml")
        kwargs.setdefault("project_name", run_name)
        kwargs.setdefault("task_name", kwargs["project_name"])
        self.task = clearml.Task.current_task() or clearml.Task.init(**kwargs)

    @property
    def tracker(self) -> Any:
        return self.task

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.task.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        reporter = self.task.get_logger()
        for key, value in _scalars(values).items():
            title, _, series = key.rpartition("/")
            reporter.report_scalar(title=title or key, series=series, value=value, iteration=step or 0, **kwargs)

    def finish(self) -> None:
        self.task.close()


class DVCLiveTracker(GeneralTracker):
    """DVCLive: `dvclive.Live(**kwargs)` (metrics under its `dir`, default "dvclive"), or the `live` object given."""

    name: ClassVar[str] = "dvclive"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(
        self, run_name: str | None = None, logging_dir: str | None = None, live: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(run_name or "accel", logging_dir)
        dvclive = _library("dvclive", "dvclive", "dvclive")
        self.live = live if live is not None else dvclive.Live(**kwargs)

    @property
    def tracker(self) -> Any:
        return self.live

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.live.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.live.step = step
        for key, value in _scalars(values).items():
            self.live.log_metric(key, value, **kwargs)
        self.live.next_step()

    def finish(self) -> None:
        self.live.end()


class TrackioTracker(GeneralTracker):
    """Trackio: `trackio.init(project=run_name, **kwargs)` (a local database; nothing leaves the machine)."""

    name: ClassVar[str] = "trackio"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        self._trackio = _library("trackio", "trackio", "trackio")
        self.run = self._trackio.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(_scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class SwanLabTracker(GeneralTracker):
    """SwanLab: `swanlab.init(project=run_name, **kwargs)` (`mode="offline"` or "local" keeps it on disk)."""

    name: ClassVar[str] = "swanlab"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, logging_dir: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, logging_dir)
        self._swanlab = _library("swanlab", "swanlab", "swanlab")
        self.run = self._swanlab.init(project=run_name, **kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._swanlab.config.update(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(_scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


LOGGER_TYPE_TO_CLASS: dict[str, type[GeneralTracker]] = {
    cls.name: cls
    for cls in (
        AimTracker,
        CometMLTracker,
        MLflowTracker,
        TensorBoardTracker,
        WandBTracker,
        ClearMLTracker,
        DVCLiveTracker,
        SwanLabTracker,
        TrackioTracker,
    )
}


def get_available_trackers() -> list[str]:
    """Names of Accelerate's trackers whose library is installed here."""
    return [name for name in LOGGER_TYPE_TO_CLASS if getattr(imports, f"is_{name}_available")()]
