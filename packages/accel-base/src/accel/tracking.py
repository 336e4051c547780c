"""Experiment trackers under Accelerate's names: `Accelerator(log_with="wandb")`, `accel.tracking.WandBTracker`.

Each tracker wraps its library and is created on the main process only (`init_trackers`),
so only rank 0 logs. The library is imported when the tracker starts; a missing one raises
an ImportError naming the extra to install (`pip install "accel-base[wandb]"`). Offline or
local modes are the libraries' own settings, passed through `init_kwargs` or their
environment variables (W&B `WANDB_MODE=offline`, MLflow's file store, Aim's local repo,
ClearML `CLEARML_OFFLINE_MODE=1`, Comet `online=False`, SwanLab `mode="offline"`).

Write your own as for Accelerate: subclass `GeneralTracker` (class attributes `name` and
`requires_logging_directory`, a `tracker` property, `super().__init__()` in `__init__`,
the library started in `start()`), then pass an instance in `log_with=[...]` or
`register_tracker_class` it and pass its name.
"""

from __future__ import annotations

import os
from typing import Any

from .trackers.base import GeneralTracker, JSONLTracker, TensorBoardTracker
from .trackers.hub import _TRACKERS, register_tracker
from .trackers.libraries import (
    LOGGER_TYPE_TO_CLASS,
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    MLflowTracker,
    SwanLabTracker,
    TrackioTracker,
    WandBTracker,
    get_available_trackers,
    on_main_process,
)


def filter_trackers(log_with: Any, logging_dir: str | os.PathLike[str] | None = None) -> list[Any]:
    """`log_with` as a list of tracker names/objects ("all": every available one).

    Raises:
        ValueError: a tracker that needs a logging directory without one.
    """
    items = log_with if isinstance(log_with, (list, tuple)) else [log_with] if log_with is not None else []
    if "all" in items:
        return list(get_available_trackers())
    out = []
    for item in items:
        cls = _TRACKERS.get(item) if isinstance(item, str) else None
        if cls is not None and cls.requires_logging_directory and logging_dir is None:
            raise ValueError(f"Logging with `{item}` requires a `logging_dir` to be passed in.")
        out.append(item)
    return out


def register_tracker_class(tracker_class: type[GeneralTracker]) -> type[GeneralTracker]:
    """Make a `GeneralTracker` subclass usable as `log_with=<its name>` (Accelerate's spelling of `register_tracker`).

    Raises:
        ValueError: not a `GeneralTracker` subclass, no `name`, or no `requires_logging_directory`.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {tracker_class}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            "The tracker class to register must define a `requires_logging_directory` class attribute. "
            "Set it to True if the tracker needs a `logging_dir` (it is then built as "
            "`cls(project_name, logging_dir, **init_kwargs)`), False otherwise."
        )
    return register_tracker(tracker_class)


__all__ = [
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "LOGGER_TYPE_TO_CLASS",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]
