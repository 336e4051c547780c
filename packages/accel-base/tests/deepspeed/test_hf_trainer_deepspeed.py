"""transformers' Trainer with a DeepSpeed config (`TrainingArguments(deepspeed=...)`), the most common way
DeepSpeed is used: under `accel.as_accelerate` it gives exactly Accelerate 1.15's numbers (losses, gradient
norms, learning rates of the config's "auto"-filled scheduler). Trainer hands Accelerate's DeepSpeedPlugin its
`HfTrainerDeepSpeedConfig` (an `HfDeepSpeedConfig` subclass) and later swaps `plugin.hf_ds_config` and
`plugin.deepspeed_config`, which accel follows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="the reference is Hugging Face Accelerate 1.15")
pytest.importorskip("transformers")

SCRIPT = """
import json, sys
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0,
                                   eos_token_id=0))
data = [{"input_ids": torch.randint(0, 64, (16,)), "labels": torch.randint(0, 64, (16,))} for _ in range(8)]
ds = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                 "warmup_num_steps": "auto"}},
}
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=2, max_steps=3, deepspeed=ds,
                         report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
logs = [{k: v for k, v in e.items() if k in ("loss", "grad_norm", "learning_rate")} for e in trainer.state.log_history]
print("RESULT " + json.dumps({"engine": type(trainer.model_wrapped).__name__, "logs": [e for e in logs if e]}))
"""


def _result(cmd: list[str], env: dict[str, str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def test_trainer_with_a_deepspeed_config_gives_accelerates_numbers(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for name in ("ACCEL_ADAPTER", "ACCEL_STRATEGY"):
        env.pop(name, None)
    accelerate = _result(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--use_deepspeed",
            "--zero_stage",
            "2",
            "--num_processes",
            "1",
            str(script),
            str(tmp_path / "accelerate"),
        ],
        env,
    )
    accel = _result(
        [
            sys.executable,
            "-m",
            "accel.cli",
            "launch",
            "--num-processes",
            "1",
            "-m",
            "accel.as_accelerate",
            str(script),
            str(tmp_path / "accel"),
        ],
        env,
    )
    assert accelerate["engine"] == accel["engine"] == "DeepSpeedEngine"
    assert len(accel["logs"]) == 3 and accel["logs"] == accelerate["logs"], (accel, accelerate)
    # The config's WarmupLR got its "auto" values from the Trainer: 0 at the first step, then the peak lr.
    assert [e["learning_rate"] for e in accel["logs"]] == [0.0, 5e-05, 5e-05]
