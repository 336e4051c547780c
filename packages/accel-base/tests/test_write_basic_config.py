"""`accel.utils.write_basic_config` (Accelerate's `write_basic_config`): a default config file from code."""

from __future__ import annotations

from pathlib import Path

import pytest
from accel.commands.config import launch_defaults_from_file
from accel.settings.config_file import load_accel_config
from accel.utils import write_basic_config


def test_writes_a_file_accel_launch_reads(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "config.yaml"
    assert write_basic_config("BF16", save_location=str(path)) == path
    assert load_accel_config(path).mixed_precision == "bf16"
    defaults = launch_defaults_from_file(str(path))
    assert defaults["mixed_precision"] == "bf16"
    assert defaults.get("num_processes") is None  # one per device of the adapter, decided at launch


def test_default_location_is_where_accel_launch_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(tmp_path / "default.yaml"))
    assert write_basic_config(mixed_precision="bf16") == tmp_path / "default.yaml"
    assert launch_defaults_from_file(None)["mixed_precision"] == "bf16"


def test_an_existing_file_is_never_overwritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("something: of the user's\n")
    assert write_basic_config("fp16", save_location=path) is False
    assert path.read_text() == "something: of the user's\n"
    assert f"Configuration already exists at {path}, will not override." in capsys.readouterr().out


def test_a_bad_precision_gets_accelerates_message(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"`mixed_precision` should be one of 'no', 'fp16', 'bf16', or 'fp8'\. Received fp32"
    ):
        write_basic_config("fp32", save_location=tmp_path / "c.yaml")
    assert not (tmp_path / "c.yaml").exists()
