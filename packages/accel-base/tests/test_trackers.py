"""Trackers: real TensorBoard event files and JSONL read back, main process only, new trackers by registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel import Accelerator
from accel.trackers import hub as accel_trackers
from accel.trackers.hub import GeneralTracker, register_tracker
from conftest import launch

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _read_events(directory: Path) -> Any:
    reader = event_accumulator.EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    reader.Reload()
    return reader


def _text(reader: Any, tag: str) -> list[tuple[int, str]]:
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in reader.Tensors(tag)]


def test_tensorboard_event_files_hold_what_was_logged(tmp_path: Path) -> None:
    acc = Accelerator(log_with="tensorboard", project_dir=str(tmp_path))
    acc.init_trackers("run", config={"lr": 0.1, "model": "mlp"})
    acc.log({"loss": 0.5, "accuracy": torch.tensor(0.25)}, step=1)
    acc.log({"loss": 0.125, "note": "warmup done"}, step=2)
    acc.log({"lr": {"group0": 0.1, "group1": 0.01}}, step=2)
    assert acc.get_tracker("tensorboard", unwrap=True) is acc.trackers[0].writer
    acc.end_training()

    files = list((tmp_path / "run").glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    reader = _read_events(tmp_path / "run")
    assert [(e.step, e.value) for e in reader.Scalars("loss")] == [(1, 0.5), (2, 0.125)]
    assert [(e.step, e.value) for e in reader.Scalars("accuracy")] == [(1, 0.25)]
    assert _text(reader, "note/text_summary") == [(2, "warmup done")]
    # add_scalars writes one run per key under the tag's directory.
    group1 = _read_events(tmp_path / "run" / "lr_group1")
    assert [(e.step, round(e.value, 6)) for e in group1.Scalars("lr")] == [(2, 0.01)]


def test_jsonl_rows_and_config_read_back(tmp_path: Path) -> None:
    acc = Accelerator(log_with=["jsonl"], project_dir=str(tmp_path))
    acc.init_trackers("exp", config={"epochs": 3})
    for step in range(3):
        acc.log({"loss": 1.0 / (step + 1), "tokens": torch.tensor(step * 10)}, step=step)
    acc.end_training()
    rows = [json.loads(line) for line in (tmp_path / "exp" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"], r["tokens"]) for r in rows] == [(0, 1.0, 0), (1, 0.5, 10), (2, 1.0 / 3, 20)]
    assert all(isinstance(r["time"], float) for r in rows)
    assert json.loads((tmp_path / "exp" / "config.json").read_text()) == {"epochs": 3}


class MemoryTracker(GeneralTracker):
    """A tracker written for Accelerate (its constructor contract), keeps what it is given."""

    name: ClassVar[str] = "memory-test"
    requires_logging_directory: ClassVar[bool] = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.kwargs = kwargs
        self.started = 0
        self.config: dict[str, Any] = {}
        self.rows: list[tuple[int | None, dict[str, Any]]] = []
        self.finished = False

    @property
    def tracker(self) -> Any:
        return self.rows

    def start(self) -> None:
        self.started += 1

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        assert self.started == 1, "store_init_configuration before start"
        self.config = dict(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.rows.append((step, dict(values)))

    def finish(self) -> None:
        self.finished = True


def test_a_new_tracker_is_one_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A copy of the registry, so the test tracker does not outlive this test.
    monkeypatch.setattr(accel_trackers, "_TRACKERS", dict(accel_trackers._TRACKERS))
    with pytest.raises(ValueError, match=r"Unknown tracker 'memory-test'.*register_tracker"):
        Accelerator(log_with="memory-test")
    assert register_tracker(MemoryTracker) is MemoryTracker
    acc = Accelerator(log_with=["memory-test", "jsonl"], project_dir=str(tmp_path))
    acc.init_trackers("run", config={"a": 1}, init_kwargs={"memory-test": {"flavour": "plain"}})
    acc.log({"loss": 2.0}, step=5)
    tracker = acc.get_tracker("memory-test")
    assert isinstance(tracker, MemoryTracker)
    assert tracker.run_name == "run" and tracker.started == 1
    assert tracker.kwargs == {"flavour": "plain"} and tracker.config == {"a": 1}
    assert acc.get_tracker("memory-test", unwrap=True) is tracker.rows
    assert tracker.rows == [(5, {"loss": 2.0})]
    acc.end_training()
    assert tracker.finished
    # "all" picks up registered trackers too.
    assert "memory-test" in accel_trackers.TrackerHub("all", str(tmp_path), is_main_process=True).requested


WORKER = """
import sys
from accel import Accelerator

acc = Accelerator(log_with=["jsonl", "tensorboard"], project_dir=sys.argv[1])
acc.init_trackers("shared", config={"rank_that_wrote": acc.process_index})
for step in range(3):
    acc.log({"rank": acc.process_index, "value": 10 * step + acc.process_index}, step=step)
names = [t.name for t in acc.trackers]
if not acc.is_main_process:
    # Off the main process get_tracker hands back a tracker that does nothing.
    acc.get_tracker("jsonl").log({"ignored": 1})
    acc.get_tracker("tensorboard", unwrap=True).add_scalar("ignored", 1.0)
print(f"rank {acc.process_index} trackers={names}", flush=True)
acc.end_training()
"""


def test_only_the_main_process_writes(write_script, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = launch(write_script(WORKER), str(logs), timeout=240)
    assert "rank 0 trackers=['jsonl', 'tensorboard']" in proc.stdout
    assert "rank 1 trackers=[]" in proc.stdout
    rows = [json.loads(line) for line in (logs / "shared" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rank"], r["value"]) for r in rows] == [(0, 0, 0), (1, 0, 10), (2, 0, 20)]
    assert json.loads((logs / "shared" / "config.json").read_text()) == {"rank_that_wrote": 0}
    events = list((logs / "shared").glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    reader = _read_events(logs / "shared")
    assert [(e.step, e.value) for e in reader.Scalars("value")] == [(0, 0.0), (1, 10.0), (2, 20.0)]
    assert sorted(p.name for p in logs.rglob("*") if p.is_file() and "tfevents" not in p.name) == [
        "config.json",
        "hparams.yml",
        "metrics.jsonl",
    ]


def _hparams(directory: Path) -> dict[str, Any]:
    """The hyperparameters `add_hparams` wrote under `directory`, read back from the event file."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    reader = _read_events(directory)
    content = reader.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {
        key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
        for key, value in start.hparams.items()
    }


def test_tensorboard_config_goes_to_hparams_and_a_yaml_file(tmp_path: Path) -> None:
    import yaml

    config = {"lr": 0.125, "model": "mlp", "layers": 2, "amp": True}
    acc = Accelerator(log_with="tensorboard", project_dir=str(tmp_path))
    acc.init_trackers("run", config=config)
    acc.end_training()
    # As Accelerate: add_hparams writes its own run in a timestamped directory, and
    # hparams.yml goes into <logging_dir>/<run>/<timestamp>/.
    yamls = list((tmp_path / "run").glob("*/hparams.yml"))
    assert len(yamls) == 1, yamls
    assert yaml.safe_load(yamls[0].read_text()) == config
    hparam_dirs = [p.parent for p in (tmp_path / "run").glob("*/events.out.tfevents.*")]
    assert len(hparam_dirs) == 1, hparam_dirs
    assert _hparams(hparam_dirs[0]) == {"lr": 0.125, "model": "mlp", "layers": 2.0, "amp": True}


def test_general_tracker_has_accelerates_constructor_contract() -> None:
    class Incomplete(GeneralTracker):
        def __init__(self) -> None:
            super().__init__()

    with pytest.raises(NotImplementedError, match=r"missing.*`name`, `requires_logging_directory`, `tracker`"):
        Incomplete()

    class Blank(GeneralTracker):
        pass

    assert Blank(_blank=True).main_process_only is True
    tracker = MemoryTracker("r")
    assert (tracker.name, tracker.requires_logging_directory, tracker.main_process_only) == ("memory-test", False, True)
    # The base methods do nothing, as Accelerate's.
    assert GeneralTracker.log(tracker, {"x": 1}) is None and GeneralTracker.start(tracker) is None


def test_builtin_tracker_signatures_are_accelerates() -> None:
    import inspect

    from accel import tracking

    def params(cls: type) -> list[tuple[str, Any]]:
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    empty = inspect.Parameter.empty
    assert params(tracking.GeneralTracker) == [("self", empty), ("_blank", False)]
    assert params(tracking.TensorBoardTracker) == [
        ("self", empty),
        ("run_name", empty),
        ("logging_dir", empty),
        ("kwargs", empty),
    ]
    assert params(tracking.WandBTracker) == [("self", empty), ("run_name", empty), ("kwargs", empty)]
    assert params(tracking.AimTracker) == [
        ("self", empty),
        ("run_name", empty),
        ("logging_dir", "."),
        ("kwargs", empty),
    ]
    assert params(tracking.MLflowTracker) == [
        ("self", empty),
        ("experiment_name", None),
        ("logging_dir", None),
        ("run_id", None),
        ("tags", None),
        ("nested_run", False),
        ("run_name", None),
        ("description", None),
    ]
    assert params(tracking.DVCLiveTracker) == [("self", empty), ("run_name", None), ("live", None), ("kwargs", empty)]
    assert params(tracking.ClearMLTracker) == [("self", empty), ("run_name", None), ("kwargs", empty)]
    # Constructing one imports nothing and starts nothing (W&B is not needed for this).
    wandb = tracking.WandBTracker("proj", mode="offline")
    assert (wandb.run_name, wandb.init_kwargs, wandb.tracker) == ("proj", {"mode": "offline"}, None)


def test_a_tracker_instance_in_log_with_is_started_and_used(tmp_path: Path) -> None:
    mine = MemoryTracker("given", colour="blue")
    acc = Accelerator(log_with=[mine, "jsonl"], project_dir=str(tmp_path))
    assert mine.started == 0  # started by init_trackers, as Accelerate
    acc.init_trackers("proj", config={"b": 2})
    acc.log({"loss": 1.5}, step=3)
    assert acc.get_tracker("memory-test") is mine
    assert (mine.started, mine.config, mine.rows) == (1, {"b": 2}, [(3, {"loss": 1.5})])
    acc.end_training()
    assert mine.finished


def test_log_with_refuses_what_is_not_a_tracker() -> None:
    with pytest.raises(TypeError, match=r"log_with: 42 is neither a tracker name nor a tracker object"):
        Accelerator(log_with=[42])
    with pytest.raises(TypeError, match=r"MemoryTracker is a tracker class; pass an instance"):
        Accelerator(log_with=[MemoryTracker])


def test_register_tracker_class_checks_and_builds_as_accelerate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel.tracking import register_tracker_class

    monkeypatch.setattr(accel_trackers, "_TRACKERS", dict(accel_trackers._TRACKERS))

    class NoDirFlag(GeneralTracker):
        name = "no-dir-flag"

    with pytest.raises(ValueError, match=r"must define a `requires_logging_directory` class attribute"):
        register_tracker_class(NoDirFlag)

    class DirTracker(MemoryTracker):
        name: ClassVar[str] = "dir-test"
        requires_logging_directory: ClassVar[bool] = True

        def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
            super().__init__(run_name, **kwargs)
            self.logging_dir = logging_dir

    register_tracker_class(DirTracker)
    acc = Accelerator(log_with="dir-test", project_dir=str(tmp_path))
    acc.init_trackers("p", init_kwargs={"dir-test": {"k": 1}})
    tracker = acc.get_tracker("dir-test")
    # Built as cls(project_name, logging_dir, **init_kwargs) since it requires a logging directory.
    assert (tracker.run_name, tracker.logging_dir, tracker.kwargs) == ("p", acc.logging_dir, {"k": 1})
    acc.end_training()
