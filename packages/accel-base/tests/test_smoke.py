"""The installation works end to end: one process and two."""

from __future__ import annotations

import subprocess
import sys

import torch
from accel import Accelerator, DistributedType


def test_single_process_defaults() -> None:
    accelerator = Accelerator()
    assert accelerator.num_processes == 1
    assert accelerator.process_index == 0
    assert accelerator.distributed_type == DistributedType.NO
    assert accelerator.device == torch.device("cpu")
    assert accelerator.adapter.name == "cpu"


def test_accel_test_command_runs_two_process_self_check() -> None:
    out = subprocess.run([sys.executable, "-m", "accel.cli", "test"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "accel self-check passed on 2 process(es)" in out.stdout
