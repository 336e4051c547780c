"""A checkpoint Accelerate 1.15.0's `save_state` wrote under DeepSpeed (ZeRO-2, 2 processes) resumes under
accel's DeepSpeed strategy with the numbers Accelerate's own `load_state` gives.

Accelerate writes DeepSpeed's engine checkpoint under the tag `pytorch_model/` (module states, one ZeRO
optimizer shard per rank), `latest`, `zero_to_fp32.py` and `random_states_<rank>.pkl`. One launch trains 3
steps under the real Accelerate and saves, trains 2 more, then resumes with Accelerate's `load_state` and
records 3 steps; a second launch resumes the same directory under accel. Dropout draws from torch's
generator and DeepSpeed's `WarmupLR` (which both hand to the engine) moves the learning rate every step,
so the losses, the weights and the learning rate agree only if the engine states, the scheduler and the
random states all came back.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import launch

pytest.importorskip("accelerate", reason="the reference checkpoint is written by Hugging Face Accelerate 1.15")

SCRIPT = """
import sys
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from deepspeed.runtime.lr_schedules import WarmupLR

mode, ckpt, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
if mode == "accelerate":
    from accelerate import Accelerator as _Accelerator, DeepSpeedPlugin
    from accelerate.utils import InitProcessGroupKwargs, set_seed

    def Accelerator(**kwargs):  # off an accelerator Accelerate picks no backend for DeepSpeed: name gloo
        return _Accelerator(kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")], **kwargs)
else:
    from accel import Accelerator, set_seed
    from accel.strategies.deepspeed import DeepSpeedPlugin

set_seed(0)
acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
sched = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=0.05, warmup_num_steps=10, warmup_type="linear")
loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)

def step():
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    loss = F.cross_entropy(model(x), y)
    acc.backward(loss)
    opt.step(); sched.step(); opt.zero_grad()
    return acc.gather(loss.detach()[None]).tolist()  # both ranks' losses

if mode == "accelerate":
    for _ in range(3):
        step()
    acc.save_state(str(ckpt))
    for _ in range(2):
        step()  # moves everything on: the resume below must bring it back
acc.load_state(str(ckpt))
losses = [step() for _ in range(3)]
weights = {k: v.float() for k, v in acc.get_state_dict(model).items()}
if acc.is_main_process:
    torch.save({"losses": losses, "weights": weights, "lr": sched.get_last_lr()}, out)
acc.wait_for_everyone()
"""


def test_accel_resumes_an_accelerate_deepspeed_zero2_checkpoint_with_accelerates_numbers(write_script, tmp_path: Path):
    script = write_script(SCRIPT)
    ckpt = tmp_path / "ckpt"
    launch(script, "accelerate", str(ckpt), str(tmp_path / "accelerate.pt"), timeout=900)
    shards = sorted(p.name for p in (ckpt / "pytorch_model").glob("*_optim_states.pt"))
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)], shards
    assert (ckpt / "pytorch_model" / "mp_rank_00_model_states.pt").is_file()
    assert not (ckpt / "accel_checkpoint.json").exists()

    proc = launch(script, "accel", str(ckpt), str(tmp_path / "accel.pt"), timeout=900)
    assert "was written by Accelerate, which records no hashes" in proc.stderr, proc.stderr
    ref, mine = torch.load(tmp_path / "accelerate.pt"), torch.load(tmp_path / "accel.pt")
    assert len(ref["losses"]) == len(mine["losses"]) == 3
    flat = [loss for step in ref["losses"] for loss in step]
    assert len(flat) == 6
    assert [loss for step in mine["losses"] for loss in step] == pytest.approx(flat, abs=1e-6)
    assert mine["lr"] == pytest.approx(ref["lr"], abs=1e-12)
    assert set(mine["weights"]) == set(ref["weights"])
    for name, value in ref["weights"].items():
        torch.testing.assert_close(mine["weights"][name], value, atol=1e-6, rtol=0)
