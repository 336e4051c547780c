"""Accelerate's `downcast_bf16` (`accelerate launch --downcast_bf16`, the config file's `downcast_bf16`,
`ACCELERATE_DOWNCAST_BF16`): under bf16, torch_xla keeps float32 tensors in bf16 (`XLA_DOWNCAST_BF16`) and the
forward runs without autocast — measured on torch_xla's real CPU device, where the variable acts as on a TPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from accel.cli import _launch_parser, worker_env
from accel.commands.launch_resolve import resolve
from accel.testing.launching import run_launch

WORKER = Path(__file__).parent / "workers" / "bf16_storage.py"


def _env(tmp_path: Path, *flags: str) -> dict[str, str]:
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--adapter", "xla", *flags, str(script)]
    parser = _launch_parser(argv)
    return worker_env(resolve(parser.parse_args(argv), parser))


@pytest.mark.parametrize("flag", ["--downcast_bf16", "--downcast-bf16"])
def test_the_flag_in_both_spellings_reaches_the_workers(tmp_path: Path, flag: str) -> None:
    env = _env(tmp_path, "--pjrt-device", "CPU", "--mixed-precision", "bf16", flag)
    assert env["ACCEL_XLA_DOWNCAST_BF16"] == "1"
    assert "ACCEL_XLA_DOWNCAST_BF16" not in _env(tmp_path, "--pjrt-device", "CPU", "--mixed-precision", "bf16")


def test_the_config_file_key_and_accelerates_variable_ask_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tpu.yaml"
    config.write_text("distributed_type: XLA\nmixed_precision: bf16\ndowncast_bf16: 'yes'\nnum_processes: 1\n")
    assert _env(tmp_path, "--config_file", str(config), "--pjrt-device", "CPU")["ACCEL_XLA_DOWNCAST_BF16"] == "1"
    config.write_text("distributed_type: XLA\nmixed_precision: bf16\ndowncast_bf16: 'no'\nnum_processes: 1\n")
    assert "ACCEL_XLA_DOWNCAST_BF16" not in _env(tmp_path, "--config_file", str(config), "--pjrt-device", "CPU")

    from accel.compat.env import apply_accelerate_env

    monkeypatch.setenv("ACCELERATE_DOWNCAST_BF16", "true")
    monkeypatch.delenv("ACCEL_XLA_DOWNCAST_BF16", raising=False)
    apply_accelerate_env()
    assert os.environ["ACCEL_XLA_DOWNCAST_BF16"] == "true"
    monkeypatch.delenv("ACCEL_XLA_DOWNCAST_BF16")


def test_downcast_needs_bf16_as_accelerate_says(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch_xla")
    from accel import Accelerator
    from accel.adapter.options import AdapterOptionsError

    adapter = Accelerator().adapter
    monkeypatch.setenv("XLA_USE_BF16", "0")  # restored after the test: the check below must not change them
    monkeypatch.setenv("XLA_DOWNCAST_BF16", "0")
    monkeypatch.setenv("ACCEL_XLA_DOWNCAST_BF16", "1")
    with pytest.raises(
        AdapterOptionsError, match=r"Can only use `downcast_bf16` .* `mixed_precision='bf16'`, not 'no'"
    ):
        adapter.precision_fallback("no")
    assert adapter.bf16_storage() == "XLA_DOWNCAST_BF16"
    assert adapter.autocast("bf16").__class__.__name__ == "nullcontext"
    monkeypatch.delenv("ACCEL_XLA_DOWNCAST_BF16")
    assert adapter.bf16_storage() is None  # torch_xla's CPU device: bf16 autocasts, as Accelerate off a TPU
    assert isinstance(adapter.autocast("bf16"), torch.autocast)


def test_downcast_bf16_keeps_tensors_in_bf16_on_the_device_without_autocast() -> None:
    """A real launch on torch_xla's CPU device: torch_xla's variables set before the model reaches the device,
    1 + 1e-3 rounds to 1 there (bf16 storage; this process, without them, computes 1.001), no autocast in the
    forward, and 3 SGD steps track the same steps computed in bf16 on the host."""
    torch_xla = pytest.importorskip("torch_xla")
    flags = ("--adapter", "xla", "--pjrt-device", "CPU", "--mixed-precision", "bf16", "--downcast_bf16")
    proc = run_launch(WORKER, nproc=1, launch_args=flags, env={"PJRT_DEVICE": "CPU"})
    (worker,) = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("WORKER ")]
    assert worker["env"] == {"XLA_USE_BF16": "0", "XLA_DOWNCAST_BF16": "1", "ACCEL_XLA_DOWNCAST_BF16": "1"}
    assert worker["mixed_precision"] == "bf16"
    assert worker["probe"] == 1.0
    assert float((torch.tensor([1.0], device=torch_xla.device()) + 1e-3).cpu()) == pytest.approx(1.001, abs=1e-6)
    assert worker["autocast"] == [False, False, False]
    torch.testing.assert_close(worker["losses"], worker["ref_losses"], rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(worker["weight"], worker["ref_weight"], rtol=2e-2, atol=2e-3)
