"""An Accelerate script that saves a checkpoint, or resumes from one, run under Accelerate and under accel.

    python resume_from_accelerate.py save CKPT_DIR OUT_FILE [safe|bin]
    python resume_from_accelerate.py resume CKPT_DIR OUT_FILE

`save` trains 5 steps and calls `save_state(CKPT_DIR)`; `resume` builds the same objects, calls
`load_state(CKPT_DIR)` and trains 6 more steps. Every step draws from Python's, NumPy's and torch's
generators (input noise, dropout), so the next steps depend on every restored state: weights,
AdamW's moments, the scheduler, a registered object and each rank's random states. Rank 0 writes the
losses it saw, `accelerator.step`, the registered object's count and the final weights to OUT_FILE.
With ACCEL_TEST_FSDP=full|sharded the model is prepared with FSDP2 and that state dict type. With
ACCEL_TEST_STATEFUL=1 the loader shuffles and is stateful (`use_stateful_dataloader`, torchdata's
StatefulDataLoader under Accelerate): the resumed run goes on from the saved batch of the epoch, into the next.
"""

import os
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, FullyShardedDataParallelPlugin, set_seed
from torch.utils.data import DataLoader, TensorDataset

mode, ckpt, out = sys.argv[1], sys.argv[2], sys.argv[3]
safe = sys.argv[4:] != ["bin"]
fsdp = os.environ.get("ACCEL_TEST_FSDP")
stateful = os.environ.get("ACCEL_TEST_STATEFUL") == "1"


class Counter:
    """A registered object (`register_for_checkpointing`)."""

    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count, "seen": torch.tensor([float(self.count)])}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


set_seed(3)
g = torch.Generator().manual_seed(11)
features = torch.randn(64, 8, generator=g)
targets = features @ torch.randn(8, 2, generator=g)

plugin = None
if fsdp:
    state_dict_type = "SHARDED_STATE_DICT" if fsdp == "sharded" else "FULL_STATE_DICT"
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=state_dict_type, reshard_after_forward=True)
accelerator = Accelerator(
    fsdp_plugin=plugin, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=stateful)
)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
loader = DataLoader(TensorDataset(features, targets), batch_size=4, shuffle=stateful)
model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
counter = Counter()
accelerator.register_for_checkpointing(counter)

if mode == "resume":
    accelerator.load_state(ckpt)
steps = 5 if mode == "save" else 6
losses = []


def epochs():
    """Batches of one epoch after another (a resumed stateful loader finishes the saved epoch first)."""
    while True:
        yield from loader


batches = epochs()
for _ in range(steps):
    x, y = next(batches)
    # Every generator takes part: a state restored wrongly changes the numbers.
    noise = float(np.random.rand()) * 0.1 + random.random() * 0.1
    x = x + noise + 0.05 * torch.randn_like(x)
    loss = F.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    counter.count += 1
    losses.append(accelerator.gather(loss.detach()).mean().item())
    accelerator.step += 1

if mode == "save":
    accelerator.save_state(ckpt, safe_serialization=safe)
accelerator.wait_for_everyone()
state = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    weights = {k: v.detach().float().cpu() for k, v in state.items()}
    partial = out + ".partial"
    torch.save(
        {
            "losses": losses,
            "weights": weights,
            "step": accelerator.step,
            "count": counter.count,
            "lr": scheduler.get_last_lr(),
        },
        partial,
    )
    os.replace(partial, out)
accelerator.end_training()
