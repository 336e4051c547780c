"""Accelerate's `downcast_bf16` on torch_xla's device: prints one JSON line with torch_xla's variables, what the
device computes for 1 + 1e-3, whether the forward autocast, and 3 SGD steps against the same steps in bf16 on the
host."""

import copy
import json
import os

import torch
from accel import Accelerator

accelerator = Accelerator()
device = accelerator.device
probe = float((torch.tensor([1.0], device=device) + 1e-3).cpu())

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
reference = copy.deepcopy(model).to(torch.bfloat16)
x, y = torch.randn(16, 8), torch.randn(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
autocast_on: list[bool] = []
model.register_forward_pre_hook(lambda module, args: autocast_on.append(torch.is_autocast_enabled("xla")))

losses = []
for _ in range(3):
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(loss))

ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
ref_losses = []
for _ in range(3):
    loss = torch.nn.functional.mse_loss(reference(x.bfloat16()), y.bfloat16())
    loss.backward()
    ref_optimizer.step()
    ref_optimizer.zero_grad()
    ref_losses.append(float(loss))

info = {
    "env": {k: os.environ.get(k) for k in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16", "ACCEL_XLA_DOWNCAST_BF16")},
    "mixed_precision": accelerator.mixed_precision,
    "probe": probe,
    "autocast": autocast_on,
    "losses": losses,
    "ref_losses": ref_losses,
    "weight": accelerator.unwrap_model(model).weight.detach().cpu().float().tolist(),
    "ref_weight": reference.weight.detach().float().tolist(),
}
print("WORKER " + json.dumps(info), flush=True)
