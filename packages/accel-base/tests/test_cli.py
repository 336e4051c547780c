"""The `accel` command: launch flags mapped onto torchrun and the workers' environment, `accel env`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from accel import Accelerator
from accel.cli import _launch_parser, build_torchrun_argv, worker_env
from accel.errors import AdapterNotFoundError


def argv_for(*args: str) -> list[str]:
    return build_torchrun_argv(_launch_parser(args).parse_args(list(args)))


def test_single_node_is_standalone() -> None:
    assert argv_for("--num-processes", "2", "train.py", "--lr", "1") == [
        "--nproc-per-node",
        "2",
        "--nnodes",
        "1",
        "--max-restarts",
        "0",
        "--standalone",
        "train.py",
        "--lr",
        "1",
    ]


def test_multi_node_c10d_rendezvous_and_restarts() -> None:
    argv = argv_for(
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "head:29400",
        "--max-restarts",
        "3",
        "train.py",
    )
    assert argv[:6] == ["--nproc-per-node", "1", "--nnodes", "2", "--max-restarts", "3"]
    assert "--standalone" not in argv
    assert argv[argv.index("--rdzv-endpoint") + 1] == "head:29400"
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[-1] == "train.py"


def test_module_mode() -> None:
    assert argv_for("-m", "pkg.train")[-2:] == ["--module", "pkg.train"]


def test_accel_flags_become_worker_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_ADAPTER", raising=False)
    args = _launch_parser().parse_args(
        [
            "--mixed-precision",
            "bf16",
            "--gradient-accumulation-steps",
            "4",
            "--timeout",
            "30",
            "--debug",
            "--cpu",
            "t.py",
        ]
    )
    env = worker_env(args)
    assert env["ACCEL_MIXED_PRECISION"] == "bf16"
    assert env["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "4"
    assert env["ACCEL_TIMEOUT"] == "30.0"
    assert env["ACCEL_DEBUG_MODE"] == "1"
    assert env["ACCEL_ADAPTER"] == "cpu"


def test_adapter_launch_flags_come_from_the_contract() -> None:
    args = _launch_parser(["--adapter", "fakedev"]).parse_args(
        ["--adapter", "fakedev", "--emulate", "--fakedev-lazy", "t.py"]
    )
    env = worker_env(args)
    assert env["FAKEDEV_LAZY"] == "1"
    assert env["ACCEL_EMULATE"] == "1"


def test_unknown_adapter_in_launch_lists_installed_ones() -> None:
    args = _launch_parser().parse_args(["--adapter", "nosuch", "t.py"])
    with pytest.raises(AdapterNotFoundError, match=r"No accel adapter named 'nosuch'.*cpu"):
        worker_env(args)


def test_env_reports_every_adapter_with_its_state() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "accel.cli", "env"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "torch: " in out
    assert "cpu" in out and "always available" in out
    assert "broken" in out and "BROKEN" in out and "accel_missing_vendor_sdk" in out
    assert "absent" in out and "no absentdev driver found" in out
    assert "selected: cpu" in out


def test_jsonl_tracker_writes_what_was_logged(tmp_path) -> None:
    acc = Accelerator(log_with="jsonl", project_dir=str(tmp_path))
    acc.init_trackers("run", config={"lr": 0.1})
    acc.log({"loss": 1.5}, step=1)
    acc.log({"loss": 0.5}, step=2)
    acc.end_training()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.5), (2, 0.5)]
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"lr": 0.1}


def test_unknown_tracker_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown tracker 'nosuch'"):
        Accelerator(log_with="nosuch")
