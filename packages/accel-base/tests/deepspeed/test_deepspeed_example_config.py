"""An Accelerate example-style DeepSpeed script with a config file ("auto" values), under
`accel launch --use_deepspeed --deepspeed_config_file ... -m accel.as_accelerate` with Accelerate installed,
against the same training written with DeepSpeed alone (2 gloo processes each).

Accelerate 1.15 cannot run DeepSpeed on CPUs (with ACCELERATE_USE_CPU it ignores DeepSpeed, without it it
believes it runs one process), so the reference is raw DeepSpeed: `deepspeed.initialize` with the same JSON
config, its "auto" values filled by hand as Accelerate documents them. The scripts are
compat_tests/scripts/nlp_deepspeed.py (the example) and nlp_deepspeed_raw.py (the reference).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import launch

SCRIPTS = Path(__file__).resolve().parents[4] / "compat_tests" / "scripts"
MISSING = [m for m in ("accelerate", "transformers", "datasets") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"the example-style script needs {', '.join(MISSING)} installed (with Accelerate beside accel)",
)


def test_deepspeed_config_example_matches_raw_deepspeed(tmp_path: Path) -> None:
    env = {"DS_ACCELERATOR": "cpu"}
    ref_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    ref = subprocess.run(
        [*ref_cmd, str(SCRIPTS / "nlp_deepspeed_raw.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env},
    )
    assert ref.returncode == 0, f"raw DeepSpeed run failed:\n{ref.stdout[-3000:]}\n{ref.stderr[-6000:]}"
    config = str(SCRIPTS / "nlp_deepspeed_config.json")
    flags = ("--use_deepspeed", "--deepspeed_config_file", config, "-m", "accel.as_accelerate")
    launch(SCRIPTS / "nlp_deepspeed.py", str(tmp_path), launch_args=flags, env=env, timeout=600)
    raw, got = torch.load(tmp_path / "raw.pt"), torch.load(tmp_path / "result.pt")

    # Every "auto" was filled as Accelerate fills it, to the values written by hand for DeepSpeed alone.
    # (accel adds zero_optimization.stage3_gather_16bit_weights_on_model_save, its zero3_save_16bit_model
    # default, which stage 2 does not read: only the config file's own keys are compared.)
    for key, value in raw["config"].items():
        if key == "zero_optimization":
            assert {k: got["config"][key][k] for k in value} == value
        else:
            assert got["config"][key] == value, key
    assert got["config"]["train_batch_size"] == 16 and got["config"]["gradient_clipping"] == 1.0
    assert got["config"]["scheduler"]["params"]["total_num_steps"] == 8

    assert len(got["losses"]) == 2 and all(len(epoch) == 8 for epoch in got["losses"])
    assert got["losses"] == raw["losses"], "per-rank losses of every micro-batch, bitwise"
    assert got["accuracy"] == raw["accuracy"]
    assert set(got["weights"]) == set(raw["weights"])
    for name, value in raw["weights"].items():
        torch.testing.assert_close(got["weights_straight"][name], value, atol=0, rtol=0, msg=name)
    # load_state of the first epoch's checkpoint, then the second epoch again: the same numbers.
    assert got["resumed_losses"] == got["losses"][1] and got["resumed_accuracy"] == got["accuracy"][1]
    for name, value in got["weights_straight"].items():
        torch.testing.assert_close(got["weights"][name], value, atol=0, rtol=0, msg=name)
    assert (tmp_path / "epoch_0" / "pytorch_model").is_dir(), "DeepSpeed's own checkpoint layout"
