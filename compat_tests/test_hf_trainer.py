"""transformers' Trainer, a peft LoRA model and trl's SFTTrainer run on accel with Accelerate's numbers.

`scripts/hf_trainer.py` runs unchanged on 2 CPU processes, once under the real Accelerate and once
under `accel launch --num-processes 2 -m accel.as_accelerate` (Accelerate installed beside it): every
logged loss and eval metric, the saved checkpoint and the final weights agree within 1e-5. With DDP
the same launch also checks the peft and trl parts. Both modes check Trainer's own resume from its
epoch-1 checkpoint: it ends where the uninterrupted run ends, bitwise, and where Accelerate's resumed
run ends. With Trainer's `fsdp` arguments accel shards the model with FSDP2, and Trainer saves and
resumes its checkpoints through `accelerate.utils.save_fsdp_model`/`load_fsdp_model`/`*_fsdp_optimizer`,
accel's; Accelerate 1.15.0 runs FSDP only on accelerators and trains plain data-parallel on CPUs, which
is the same arithmetic, so its numbers are still the reference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, check, check_reference, torchrun

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("trl")


def accel_launch(*args: str) -> subprocess.CompletedProcess[str]:
    """`accel launch --num-processes 2 -m accel.as_accelerate ARGS`, as the migration guide says."""
    accel = Path(sys.executable).with_name("accel")
    cmd = [str(accel), "launch", "--num-processes", "2", "-m", "accel.as_accelerate", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def assert_same(got: object, ref: object, where: str) -> None:
    if isinstance(ref, dict) and ref and all(isinstance(v, torch.Tensor) for v in ref.values()):
        assert isinstance(got, dict) and set(got) == set(ref), where
        for name, value in ref.items():
            torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0, msg=f"{where}: {name}")
    elif isinstance(ref, list):
        assert isinstance(got, list) and len(got) == len(ref), where
        for i, (g, r) in enumerate(zip(got, ref)):
            assert g.keys() == r.keys(), (where, i)
            assert g == pytest.approx(r, abs=1e-5), (where, i)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_trainer_peft_and_trl_give_accelerates_numbers(real_accelerate: Path, tmp_path: Path, mode: str) -> None:
    script = str(SCRIPTS / "hf_trainer.py")
    (tmp_path / "accelerate").mkdir()
    (tmp_path / "accel").mkdir()
    reference = tmp_path / "accelerate" / "result.pt"
    check_reference(torchrun(script, str(reference.parent), mode, accel=False), reference)
    check(accel_launch(script, str(tmp_path / "accel"), mode))
    ref, got = torch.load(reference), torch.load(tmp_path / "accel" / "result.pt")
    expected = {"history", "weights", "checkpoint", "resumed_history", "resumed_weights"}
    if mode == "ddp":
        expected |= {"lora_history", "lora_weights", "sft_history", "sft_weights"}
    assert expected <= set(ref) and set(ref) == set(got)
    for key in sorted(expected):
        assert_same(got[key], ref[key], key)
    assert len(got["history"]) == 19 and any("eval_accuracy" in e for e in got["history"])
    assert got["sharded"] is (mode == "fsdp2"), "Trainer's fsdp arguments shard the model on accel"
    # Trainer's resume from its epoch-1 checkpoint ends where the uninterrupted run ends.
    assert got["resumed_history"][-3:] == got["history"][-3:]
    for name, value in got["weights"].items():
        torch.testing.assert_close(got["resumed_weights"][name], value, atol=0, rtol=0, msg=name)
    if mode == "fsdp2":
        # Trainer saved and resumed through accel's save_fsdp_model/save_fsdp_optimizer/load_fsdp_*, in
        # Accelerate's layout (FULL_STATE_DICT, Trainer's default), next to its own files.
        assert {"pytorch_model_fsdp.bin", "optimizer.bin", "model.safetensors"} <= set(got["checkpoint_files"])
    else:
        assert len(got["lora_weights"]) == 4 and len(got["sft_weights"]) == 4
