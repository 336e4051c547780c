"""`accel launch` on a TPU host, as far as torch_xla's CPU device allows: the launch flags reach the
worker's environment, and a `torch_xla.launch(_mp_fn)` script (what `accelerate launch --tpu` users
write) runs under it on one host, its function called once with index 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from accel.testing.launching import run_launch

WORKER = Path(__file__).parent / "workers" / "tpu_host.py"


def _workers(stdout: str) -> list[dict]:
    return [json.loads(line.removeprefix("WORKER ")) for line in stdout.splitlines() if line.startswith("WORKER ")]


def test_torch_xla_launch_script_runs_one_host_on_the_cpu_device() -> None:
    pytest.importorskip("torch_xla")
    flags = ("--adapter", "xla", "--pjrt-device", "CPU", "--xla-cpu-devices", "1")
    proc = run_launch(WORKER, nproc=1, launch_args=flags, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "7"})
    (worker,) = _workers(proc.stdout)
    assert worker["index"] == 0, "torch_xla.launch under a launcher calls the function once, with the local rank"
    assert worker["env"]["PJRT_DEVICE"] == "CPU"
    assert worker["env"]["CPU_NUM_DEVICES"] == "1", "set by --xla-cpu-devices over the inherited value"
    assert worker["adapter"] == "xla" and worker["device"] == "xla:0"
    assert worker["distributed_type"].endswith("XLA") and worker["num_processes"] == 1
    assert worker["strategy"] == "xla_ddp"
    assert worker["loss"] > 0


def test_strategy_flag_reaches_the_worker_and_turns_spmd_on_first() -> None:
    pytest.importorskip("torch_xla")
    flags = ("--adapter", "xla", "--pjrt-device", "CPU", "--strategy", "xla_fsdp_v2")
    proc = run_launch(WORKER, nproc=1, launch_args=flags, env={"PJRT_DEVICE": "CPU"})
    (worker,) = _workers(proc.stdout)
    assert worker["env"]["ACCEL_STRATEGY"] == "xla_fsdp_v2" and worker["strategy"] == "xla_fsdp_v2"
    assert worker["env"]["XLA_USE_SPMD"] == "1", "the adapter turned SPMD on before its first device lookup"
    assert worker["index"] == 0 and worker["loss"] > 0
