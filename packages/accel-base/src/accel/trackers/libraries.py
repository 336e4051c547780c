"""Accelerate's third-party trackers (wandb, mlflow, comet_ml, aim, clearml, dvclive, trackio, swanlab).

Each wraps its library, imported when the tracker starts. `accel.trackers` registers them
under their names; `accel.tracking` is the module path Accelerate's users import them from.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
from collections.abc import Callable
from typing import Any, ClassVar

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


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}


class LibraryTracker(GeneralTracker):
    """The shape Accelerate's third-party trackers share: a library whose module is the tracker's `name`,
    imported by `start`, and one run object of that library that `tracker` returns.

    `start` stores what `_open(library)` returns (by default `library.init(project=run_name, **kwargs)`) in
    the attribute named by `handle` (Accelerate's name for it: `run`, `writer`, `task`...); `log` sends the
    values as plain numbers to the run's `log`, and `finish` calls the run's `finish_method`. A subclass sets
    `name`, `requires_logging_directory` and `store_init_configuration`, and overrides the rest only where
    its library differs.

    Args:
        run_name: the project name given to `init_trackers`.
        **kwargs: the tracker's `init_kwargs`, passed to the library when the run opens.

    Raises:
        ImportError (from `start`): the library is not installed; the message names the extra to install.
    """

    name: ClassVar[str]  # set by each subclass: also the module `start` imports and the extra that installs it
    handle: ClassVar[str] = "run"
    finish_method: ClassVar[str] = "finish"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs
        setattr(self, self.handle, None)

    def start(self) -> None:
        try:
            library = importlib.import_module(self.name)
        except ImportError as exc:
            raise ImportError(
                f'The {self.name} tracker needs the `{self.name}` package: pip install "accel-base[{self.name}]"'
            ) from exc
        setattr(self, self.handle, self._open(library))

    def _open(self, library: Any) -> Any:
        """Open the library's run (`start`, main process only) and return it: `library.init(project=run_name)`."""
        return library.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return getattr(self, self.handle)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.tracker.log(_scalars(values), step=step, **kwargs)

    def finish(self) -> None:
        getattr(self.tracker, self.finish_method)()


class WandBTracker(LibraryTracker):
    """Weights & Biases: `wandb.init(project=run_name, **kwargs)` at `start` (offline with `WANDB_MODE=offline`)."""

    name: ClassVar[str] = "wandb"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.config.update(values, allow_val_change=True)


class MLflowTracker(LibraryTracker):
    """MLflow: a run of the experiment `experiment_name` (the project name given to `init_trackers`).

    As Accelerate's: `MLFLOW_EXPERIMENT_NAME`, `MLFLOW_RUN_ID`, `MLFLOW_TAGS` (JSON) and
    `MLFLOW_NESTED_RUN` override the arguments; the store is `MLFLOW_TRACKING_URI`.
    `init_kwargs={"mlflow": {"run_name": ...}}` names the run inside the experiment.
    """

    name: ClassVar[str] = "mlflow"
    requires_logging_directory: ClassVar[bool] = False
    handle: ClassVar[str] = "active_run"

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
        super().__init__(run_name)  # type: ignore[arg-type]  # MLflow's run may be unnamed
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
        self.description = description

    def _open(self, library: Any) -> Any:
        found = library.get_experiment_by_name(self.experiment_name) if self.experiment_name else None
        experiment_id = (
            found.experiment_id
            if found is not None
            else library.create_experiment(
                name=self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
            )
        )
        run = library.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )
        # MLflow logs through the module (its active run), not through the run object.
        self._mlflow = library
        return run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # MLflow caps parameter values at 500 characters.
        self._mlflow.log_params({k: str(v)[:500] for k, v in values.items()})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        metrics = {k: v for k, v in _scalars(values).items() if isinstance(v, (int, float))}
        self._mlflow.log_metrics(metrics, step=step)

    def finish(self) -> None:
        self._mlflow.end_run()


class CometMLTracker(LibraryTracker):
    """Comet: `comet_ml.start(project_name=run_name, **kwargs)` at `start` (offline with `online=False`)."""

    name: ClassVar[str] = "comet_ml"
    requires_logging_directory: ClassVar[bool] = False
    handle: ClassVar[str] = "writer"
    finish_method: ClassVar[str] = "end"

    def _open(self, library: Any) -> Any:
        return library.start(project_name=self.run_name, **self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.log_parameters(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.tracker.log_metrics(_scalars(values), step=step, **kwargs)


class AimTracker(LibraryTracker):
    """Aim: a run in the local repository `logging_dir` (default "."), named `run_name`."""

    name: ClassVar[str] = "aim"
    requires_logging_directory: ClassVar[bool] = True
    handle: ClassVar[str] = "writer"
    finish_method: ClassVar[str] = "close"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = ".", **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self.aim_repo_path = logging_dir

    def _open(self, library: Any) -> Any:
        run = library.Run(repo=str(self.aim_repo_path or "."), **self.init_kwargs)
        run.name = self.run_name
        return run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker["hparams"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in _scalars(values).items():
            self.tracker.track(value, name=key, step=step, **kwargs)


class ClearMLTracker(LibraryTracker):
    """ClearML: the current task, else `Task.init(project_name=run_name, task_name=run_name, **kwargs)`.

    `CLEARML_PROJECT` and `CLEARML_TASK` name them when `init_kwargs` does not;
    offline with `CLEARML_OFFLINE_MODE=1`.
    """

    name: ClassVar[str] = "clearml"
    requires_logging_directory: ClassVar[bool] = False
    handle: ClassVar[str] = "task"
    finish_method: ClassVar[str] = "close"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)  # type: ignore[arg-type]  # names come from the environment then
        self.user_provided_run_name = run_name

    def _open(self, library: Any) -> Any:
        current = library.Task.current_task()
        if current:
            return current
        arguments = dict(self.init_kwargs)
        arguments.setdefault("project_name", os.environ.get("CLEARML_PROJECT", self.user_provided_run_name))
        arguments.setdefault("task_name", os.environ.get("CLEARML_TASK", self.user_provided_run_name))
        return library.Task.init(**arguments)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.connect_configuration(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        reporter = self.tracker.get_logger()
        for key, value in _scalars(values).items():
            title, _, series = key.rpartition("/")
            reporter.report_scalar(title=title or key, series=series, value=value, iteration=step or 0, **kwargs)


class DVCLiveTracker(LibraryTracker):
    """DVCLive: `dvclive.Live(**kwargs)` at `start` (metrics under its `dir`, default "dvclive"), or the `live` given."""

    name: ClassVar[str] = "dvclive"
    requires_logging_directory: ClassVar[bool] = False
    handle: ClassVar[str] = "live"
    finish_method: ClassVar[str] = "end"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)  # type: ignore[arg-type]  # DVCLive names nothing after it
        self.live = live

    def _open(self, library: Any) -> Any:
        return self.live if self.live is not None else library.Live(**self.init_kwargs)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.log_params(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.tracker.step = step
        for key, value in _scalars(values).items():
            self.tracker.log_metric(key, value, **kwargs)
        self.tracker.next_step()


class TrackioTracker(LibraryTracker):
    """Trackio: `trackio.init(project=run_name, **kwargs)` at `start` (a local database)."""

    name: ClassVar[str] = "trackio"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.tracker.config.update(values)


class SwanLabTracker(LibraryTracker):
    """SwanLab: `swanlab.init(project=run_name, **kwargs)` at `start` (`mode="offline"` or "local" stays on disk)."""

    name: ClassVar[str] = "swanlab"
    requires_logging_directory: ClassVar[bool] = False
    main_process_only: ClassVar[bool] = False

    def _open(self, library: Any) -> Any:
        # The run's configuration is the module's (`swanlab.config`), not an attribute of the run.
        self._swanlab = library
        return super()._open(library)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._swanlab.config.update(values)


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
    return [name for name in LOGGER_TYPE_TO_CLASS if importlib.util.find_spec(name) is not None]
