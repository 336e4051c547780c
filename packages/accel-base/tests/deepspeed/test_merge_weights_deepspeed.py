"""`accel merge-weights` on a real DeepSpeed ZeRO-3 `save_state` (2 gloo processes): the merged
safetensors file equals the full state dict the run gathered itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from conftest import launch
from safetensors.torch import load_file

TRAIN = """
import sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.strategies.deepspeed import DeepSpeedPlugin
from safetensors.torch import save_file

out = Path(sys.argv[1])
accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, extra_config={"zero_allow_untested_optimizer": True}))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 8)), batch_size=4)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for (x,) in data:
    accelerator.backward(model(x).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
accelerator.save_state(str(out / "ckpt"))
full = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    save_file({k: v.contiguous().float() for k, v in full.items()}, str(out / "reference.safetensors"))
"""


def test_zero3_checkpoint_merges_into_the_gathered_weights(write_script, tmp_path: Path) -> None:
    launch(write_script(TRAIN), str(tmp_path), timeout=900)
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    reference = load_file(str(tmp_path / "reference.safetensors"))
    assert sorted(merged) == sorted(reference) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for name, tensor in reference.items():
        assert torch.equal(merged[name].float(), tensor), name
