"""Accelerate's trackers, each against its real package in an offline or local mode (`nox -s trackers`).

Each test logs three steps through `Accelerator(log_with=<name>)` and reads them back with
the tracker's own library or from the files it wrote. A tracker whose package is not
installed is skipped here, except with `ACCEL_REQUIRE_TRACKERS=1` (set by `nox -s trackers`),
where it fails: that session must test every tracker, not go green without one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sqlite3
import sys
import time
import zipfile
from pathlib import Path

import pytest
from accel import Accelerator
from conftest import launch

LOSSES = [1.0, 0.5, 0.25]


def _train(name: str, tmp_path: Path, **init_kwargs: object) -> Accelerator:
    accelerator = Accelerator(log_with=name, project_dir=str(tmp_path))
    accelerator.init_trackers("accel-trackers", config={"lr": 0.1, "layers": 2}, init_kwargs={name: init_kwargs})
    for step, loss in enumerate(LOSSES):
        accelerator.log({"loss": loss, "acc": 0.5 + step / 10}, step=step)
    return accelerator


REQUIRE_ENV = "ACCEL_REQUIRE_TRACKERS"


def _needs(module: str) -> None:
    """Skip when `module` is not installed; fail instead when ACCEL_REQUIRE_TRACKERS=1."""
    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(
            f"{module} is not installed but {REQUIRE_ENV}=1 requires every tracker package (accel-base[trackers])"
        )
    pytest.skip(f"{module} is not installed (nox -s trackers installs it)")


def _files_mention(root: Path, needle: bytes) -> bool:
    return any(needle in p.read_bytes() for p in root.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000)


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    accelerator = _train("wandb", tmp_path)
    run = accelerator.get_tracker("wandb", unwrap=True)
    assert run.config["lr"] == 0.1
    accelerator.end_training()

    # The run's record file is written by wandb's service process after `finish` returns, and filled in
    # as it flushes: wait for the content, not only for the file (the file alone raced the flush).
    # History items carry their values as JSON text: the last step's loss is in the record.
    def written() -> bool:
        records = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
        return (
            bool(records) and _files_mention(records[0].parent, b"loss") and _files_mention(records[0].parent, b"0.25")
        )

    deadline = time.monotonic() + 120
    while not written() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert written(), sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def test_mlflow_local_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("mlflow")
    # MLflow 3 keeps its plain-file store read-only: a local SQLite file is its local store now.
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # As Accelerate: the project names the experiment, `run_name` in init_kwargs the run.
    accelerator = _train("mlflow", tmp_path, run_name="trial-3")
    run_id = accelerator.get_tracker("mlflow", unwrap=True).info.run_id
    accelerator.end_training()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert [m.value for m in client.get_metric_history(run_id, "loss")] == LOSSES
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1", "layers": "2"}
    assert run.info.run_name == "trial-3"
    assert client.get_experiment(run.info.experiment_id).name == "accel-trackers"


def test_comet_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("comet_ml")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    _train("comet_ml", tmp_path, online=False).end_training()
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as z:
        text = b"".join(z.read(n) for n in z.namelist())
    assert b'"loss"' in text and b"0.25" in text


def test_aim_local_repo(tmp_path: Path) -> None:
    _needs("aim")
    accelerator = _train("aim", tmp_path)
    run = accelerator.get_tracker("aim", unwrap=True)
    assert run["hparams"] == {"lr": 0.1, "layers": 2}
    accelerator.end_training()
    # Aim indexes runs lazily (`aim up`); the run's metric chunks are in the local repository.
    assert _files_mention(tmp_path / ".aim" / "seqs", b"loss")


def test_clearml_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("clearml")
    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml"))
    accelerator = _train("clearml", tmp_path)
    folder = Path(accelerator.get_tracker("clearml", unwrap=True).get_offline_mode_folder())
    accelerator.end_training()
    assert _files_mention(folder, b'"loss"') and _files_mention(folder, b"0.25")


def test_dvclive_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("dvclive")
    # DVCLive initialises DVC in the enclosing git repository and writes dvc.yaml to the working
    # directory: run it where there is no repository.
    monkeypatch.chdir(tmp_path)
    _train("dvclive", tmp_path, dir=str(tmp_path / "dvclive"), save_dvc_exp=False).end_training()
    rows = (tmp_path / "dvclive" / "plots" / "metrics" / "loss.tsv").read_text().splitlines()
    assert [float(r.split("\t")[-1]) for r in rows[1:]] == LOSSES
    assert "lr: 0.1" in (tmp_path / "dvclive" / "params.yaml").read_text()


def test_trackio_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs("trackio")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    _train("trackio", tmp_path).end_training()
    (database,) = (tmp_path / "trackio").rglob("*.db")
    with sqlite3.connect(database) as db:
        rows = " ".join(
            str(r)
            for t in db.execute("select name from sqlite_master where type='table'")
            for r in db.execute(f"select * from {t[0]}")
        )
    assert "loss" in rows and "0.25" in rows


def test_swanlab_offline(tmp_path: Path) -> None:
    _needs("swanlab")
    _train("swanlab", tmp_path, mode="offline", logdir=str(tmp_path / "swanlab")).end_training()
    assert _files_mention(tmp_path / "swanlab", b"loss")


@pytest.mark.parametrize("name", ["wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "trackio", "swanlab"])
def test_a_missing_tracker_package_names_the_extra(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The package made unimportable (a None entry in sys.modules), whether or not it is installed.
    monkeypatch.setitem(sys.modules, name, None)
    accelerator = Accelerator(log_with=name, project_dir=str(tmp_path))
    with pytest.raises(ImportError, match=rf'pip install "accel-base\[{name}\]"'):
        accelerator.init_trackers("x")
    assert accelerator.trackers == []


def test_a_missing_package_fails_when_trackers_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="wandb is not installed"):
        _needs("wandb")
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"wandb is not installed but ACCEL_REQUIRE_TRACKERS=1"):
        _needs("wandb")


RANK_ZERO = """
import json, os, sys
from pathlib import Path
from accel import Accelerator

out = Path(sys.argv[1])
os.chdir(out)  # DVCLive would initialise DVC in an enclosing git repository
acc = Accelerator(log_with="dvclive", project_dir=str(out))
acc.init_trackers("p", init_kwargs={"dvclive": {"dir": str(out / f"dvclive_rank{acc.process_index}"), "save_dvc_exp": False}})
acc.log({"loss": float(acc.process_index)}, step=0)
(out / f"rank{acc.process_index}.json").write_text(json.dumps(len(acc.trackers)))
acc.end_training()
"""


def test_only_the_main_process_logs(write_script, tmp_path: Path) -> None:
    _needs("dvclive")
    launch(write_script(RANK_ZERO), str(tmp_path))
    assert json.loads((tmp_path / "rank0.json").read_text()) == 1
    assert json.loads((tmp_path / "rank1.json").read_text()) == 0
    assert (tmp_path / "dvclive_rank0").is_dir() and not (tmp_path / "dvclive_rank1").exists()
