"""Train a small model for a few steps; each rank writes where it stood and what it trained.

Run under `srun` (ranks from SLURM's variables) and under `accel launch` (torchrun's): the
two runs must agree on the world and on every trained number.
"""

import json
import sys
from pathlib import Path

import torch
from accel import Accelerator
from accel.distributed.launch_env import read_launch_env
from accel.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

out = Path(sys.argv[1])
accelerator = Accelerator(cpu=True)
set_seed(0)
x = torch.randn(64, 4)
y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
seen = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
record = {
    "world": accelerator.num_processes,
    "rank": accelerator.process_index,
    "local_rank": accelerator.local_process_index,
    "launcher": read_launch_env().launcher,
    "gathered_ranks": seen,
    "weights": accelerator.unwrap_model(model).weight.detach().flatten().tolist(),
    "bias": accelerator.unwrap_model(model).bias.detach().tolist(),
}
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
