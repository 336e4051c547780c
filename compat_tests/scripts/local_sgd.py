"""An Accelerate script using `accelerate.local_sgd.LocalSGD` (2 processes, different data per rank).

Trains a small MLP with AdamW under `accumulate` and LocalSGD(local_sgd_steps=3) for 7 steps, and
rank 0 writes the weights after every step and at the end to OUT_FILE (written whole, then renamed).
compat_tests/test_local_sgd.py runs it under the real Accelerate and, unchanged, under accel.
"""

import os
import sys

import torch
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD
from accelerate.utils import set_seed

out = sys.argv[1]
set_seed(0)
accelerator = Accelerator()
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
model, optimizer = accelerator.prepare(model, optimizer)
g = torch.Generator().manual_seed(7 + accelerator.process_index)
history = []
with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3, enabled=True) as local_sgd:
    for _ in range(7):
        x, y = torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
        history.append([p.detach().clone() for p in model.parameters()])
final = [p.detach().clone() for p in model.parameters()]
everyone = accelerator.gather(torch.cat([p.reshape(-1) for p in final]).unsqueeze(0))
if accelerator.is_main_process:
    partial = out + ".partial"
    torch.save(
        {"history": history, "final": final, "ranks_agree": bool(torch.equal(everyone[0], everyone[1]))}, partial
    )
    os.replace(partial, out)
accelerator.end_training()
