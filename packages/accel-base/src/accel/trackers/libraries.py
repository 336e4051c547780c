"""Accelerate's third-party trackers (wandb, mlflow, comet_ml, aim, clearml, dvclive, trackio, swanlab).

Each wraps its library, imported when the tracker starts. `accel.trackers` registers them
under their names; `accel.tracking` is the module path Accelerate's users import them from.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable
from typing import Any, ClassVar

from ..compat import imports
from .base import GeneralTracker, TensorBoardTracker


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for tracker methods: run only on the main process when the tracker's `main_process_only` is set."""

    @functools.wraps(function)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from ..distributed.state import PartialState

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
    """Weights & Biases: `wandb.init(project=run_name, **kwargs)` at `start` (offline with `WANDB_MODE=offline`)."""

    name: ClassVar[str] = "wandb"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def start(self) -> None:
        wandb = _library("wandb", "wandb", "wandb")
        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

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
    """MLflow: a run of the experiment `experiment_name` (the project name given to `init_trackers`).

    As Accelerate's: `MLFLOW_EXPERIMENT_NAME`, `MLFLOW_RUN_ID`, `MLFLOW_TAGS` (JSON) and
    `MLFLOW_NESTED_RUN` override the arguments; the store is `MLFLOW_TRACKING_URI`.
    `init_kwargs={"mlflow": {"run_name": ...}}` names the run inside the experiment.
    """

    name: ClassVar[str] = "mlflow"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        if isinstance(nested, str):
            nested = nested.strip().lower() in {"1", "true", "yes", "y", "on", "t"}
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        self.tags = tags
        self.nested_run = bool(nested)
        self.run_name = run_name
        self.description = description
        self.active_run: Any = None

    def start(self) -> None:
        mlflow = _library("mlflow", "mlflow", "mlflow")
        found = mlflow.get_experiment_by_name(self.experiment_name) if self.experiment_name else None
        experiment_id = (
            found.experiment_id
            if found is not None
            else mlflow.create_experiment(name=self.experiment_name, artifact_location=self.logging_dir, tags=self.tags)
        )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )
        self._mlflow = mlflow

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # MLflow caps parameter values at 500 characters.
        self._mlflow.log_params({k: str(v)[:500] for k, v in values.items()})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {k: v for k, v in _scalars(values).items() if isinstance(v, (int, float))}
        self._mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


class CometMLTracker(GeneralTracker):
    """Comet: `comet_ml.start(project_name=run_name, **kwargs)` at `start` (offline with `online=False`)."""

    name: ClassVar[str] = "comet_ml"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.writer: Any = None

    def start(self) -> None:
        comet_ml = _library("comet_ml", "comet_ml", "comet_ml")
        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

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
    """Aim: a run in the local repository `logging_dir` (default "."), named `run_name`."""

    name: ClassVar[str] = "aim"
    requires_logging_directory: ClassVar[bool] = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs
        self.writer: Any = None

    def start(self) -> None:
        aim = _library("aim", "aim", "aim")
        self.writer = aim.Run(repo=str(self.aim_repo_path or "."), **self.init_kwargs)
        self.writer.name = self.run_name

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
    """ClearML: the current task, else `Task.init(project_name=run_name, task_name=run_name, **kwargs)`.

    `CLEARML_PROJECT` and `CLEARML_TASK` name them when `init_kwargs` does not;
    offline with `CLEARML_OFFLINE_MODE=1`.
    """

    name: ClassVar[str] = "clearml"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self.task: Any = None

    def start(self) -> None:
        clearml = _library("clearml", "clearml", "clearml")
        current = clearml.Task.current_task()
        if current:
            self.task = current
            return
        arguments = dict(self.init_kwargs)
        arguments.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        arguments.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        self.task = clearml.Task.init(**arguments)

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
    """DVCLive: `dvclive.Live(**kwargs)` at `start` (metrics under its `dir`, default "dvclive"), or the `live` given."""

    name: ClassVar[str] = "dvclive"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    def start(self) -> None:
        dvclive = _library("dvclive", "dvclive", "dvclive")
        self.live = self.live if self.live is not None else dvclive.Live(**self.init_kwargs)

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
    """Trackio: `trackio.init(project=run_name, **kwargs)` at `start` (a local database)."""

    name: ClassVar[str] = "trackio"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def start(self) -> None:
        self._trackio = _library("trackio", "trackio", "trackio")
        self.run = self._trackio.init(project=self.run_name, **self.init_kwargs)

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
    """SwanLab: `swanlab.init(project=run_name, **kwargs)` at `start` (`mode="offline"` or "local" stays on disk)."""

    name: ClassVar[str] = "swanlab"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        self.run: Any = None

    def start(self) -> None:
        self._swanlab = _library("swanlab", "swanlab", "swanlab")
        self.run = self._swanlab.init(project=self.run_name, **self.init_kwargs)

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
