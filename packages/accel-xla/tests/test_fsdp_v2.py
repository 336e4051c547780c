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
from accel.errors import StrategyNotSupportedError
from accel_xla.xla_fsdp_v2 import XLAFSDPv2Config

WORKERS = Path(__file__).parent / "workers"
WORKER = WORKERS / "fsdp_v2.py"


def _run(tmp_path: Path, worker: Path = WORKER, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "CPU_NUM_DEVICES"))}
    clean |= {"PJRT_DEVICE": "CPU", "ACCEL_ADAPTER": "xla", **env}
    return subprocess.run(
        [sys.executable, str(worker), str(tmp_path)], env=clean, capture_output=True, text=True, timeout=300
    )


def test_fsdp_v2_per_layer_on_four_spmd_devices_shards_and_resumes_exactly(tmp_path: Path) -> None:
    """4 SPMD devices of torch_xla's CPU device (CPU_NUM_DEVICES=4), the two Block layers units of their own with
    gradient checkpointing: parameters, batches and outputs sharded over "fsdp", each device holding a quarter of
    the parameters, 4 AdamW steps equal to plain torch on the CPU; an SPMD distributed checkpoint resumes
    bitwise (with a second model and its momentum optimizer beside it) and keeps the sharding; a damaged shard is
    refused by its hash with nothing changed."""
    pytest.importorskip("torch_xla")
    config = '{"transformer_layer_cls_to_wrap": ["Block"], "gradient_checkpointing": true}'
    proc = _run(
        tmp_path,
        WORKERS / "fsdp_v2_layers.py",
        CPU_NUM_DEVICES="4",
        ACCEL_STRATEGY="xla_fsdp_v2",
        ACCEL_STRATEGY_CONFIG=config,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["devices"] == 4 and r["mesh"] == {"fsdp": 4, "model": 1}
    assert r["units"] == ["layers.0", "layers.1"]
    assert {"layers.0", "layers.1"} <= set(r["checkpointed"])
    assert all(spec.startswith("{devices=[") and "0,1,2,3}" in spec for spec in r["param_specs"]), r["param_specs"]
    # Every dimension the model shards divides by 4: each device holds exactly a quarter of the parameters.
    assert r["held_bytes"] == {f"CPU:{i}": r["whole_bytes"] // 4 for i in range(4)}
    assert r["batch_specs"] == ["{devices=[4,1]0,1,2,3}"] * 4
    assert r["output_spec"] == "{devices=[4,1]0,1,2,3}"
    assert r["losses"] == pytest.approx(r["expected"], rel=1e-5, abs=1e-6)
    assert r["weights_diff"] < 1e-5
    assert r["names"], "get_state_dict gives the user's names, without the units' _orig_module"
    assert {f"{d}_{i}/.metadata" for d in ("pytorch_model_fsdp", "optimizer") for i in (0, 1)} <= set(r["files"])
    assert not any(f.startswith(("model.safetensors", "optimizer.bin")) for f in r["files"])
    assert "does not match the XXH3-128 hash recorded when it was saved" in r["refused"]
    assert r["unchanged_after_refusal"]
    assert r["specs_kept"]
    assert r["resumed_bitwise"]
    assert r["exported_bitwise"]
    assert "Could not find the transformer layer class 'Missing' in the model" in r["refusals"]["missing_class"]
    assert "gradient_checkpointing recomputes each wrapped layer" in r["refusals"]["checkpointing_without_units"]


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


def test_fsdp_v2_settings_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"does not take \['layers'\]; its settings are"):
        XLAFSDPv2Config.from_any({"layers": ["Block"]})
    config = XLAFSDPv2Config.from_any({"transformer_layer_cls_to_wrap": "Block", "xla_fsdp_grad_ckpt": True})
    assert config.transformer_layer_cls_to_wrap == ["Block"] and config.gradient_checkpointing
    with pytest.raises(ValueError, match="min_num_params must be an int >= 0"):
        XLAFSDPv2Config(min_num_params=-1)


def test_fsdp_v1_is_refused_with_the_reason() -> None:
    with pytest.raises(
        StrategyNotSupportedError, match=r"torch_xla's FSDPv1 \(XlaFullyShardedDataParallel.*Use strategy='xla_fsdp_v2'"
    ):
        Accelerator(adapter="xla", emulate=True, strategy="xla_fsdp")
