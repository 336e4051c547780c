"""xla_fsdp_v2 (torch_xla SPMD FSDP) on torch_xla's CPU device, in a process of its own (SPMD mode
is global to a process), against the same loop in plain torch; and its refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator

WORKER = Path(__file__).parent / "workers" / "fsdp_v2.py"


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    clean |= {"PJRT_DEVICE": "CPU", "ACCEL_ADAPTER": "xla", **env}
    return subprocess.run(
        [sys.executable, str(WORKER), str(tmp_path)], env=clean, capture_output=True, text=True, timeout=300
    )


def test_fsdp_v2_trains_like_plain_torch_on_a_one_device_mesh(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    proc = _run(tmp_path, ACCEL_STRATEGY="xla_fsdp_v2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["strategy"] == "xla_fsdp_v2"
    assert result["wrapper"] == "SpmdFullyShardedDataParallel"
    assert result["losses"] == pytest.approx(result["expected"], rel=1e-5)
    assert result["names"], "state dicts have the unwrapped model's names"
    assert result["weights_close"]
    assert result["exported"] == ["model.safetensors"]


def test_fsdp_v2_chosen_after_the_runtime_started_says_how_to_select_it(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    code = (
        "import torch_xla; torch_xla.device()\n"
        "from accel import Accelerator\n"
        "try:\n    Accelerator(strategy='xla_fsdp_v2')\n"
        "except ValueError as e:\n    print('REFUSED', e)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    clean |= {"PJRT_DEVICE": "CPU", "ACCEL_ADAPTER": "xla"}
    proc = subprocess.run([sys.executable, "-c", code], env=clean, capture_output=True, text=True, timeout=300)
    assert "REFUSED The xla_fsdp_v2 strategy needs torch_xla's SPMD mode on" in proc.stdout, proc.stderr[-3000:]
    assert "accel launch --strategy xla_fsdp_v2" in proc.stdout


def test_fsdp_v2_is_refused_under_emulation(monkeypatch: pytest.MonkeyPatch) -> None:
    accelerator = Accelerator(adapter="xla", emulate=True, strategy="xla_fsdp_v2")
    with pytest.raises(ValueError, match=r"needs torch_xla.s SPMD partitioner, which emulation does not have"):
        accelerator.prepare(torch.nn.Linear(2, 2))
