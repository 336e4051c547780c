"""An Accelerate training script, written against `accelerate` and run unchanged under accel.

    python same_numbers.py OUT_FILE MIXED_PRECISION [seedable]

Shuffled map-style data, dropout, AdamW with a linear-warmup LambdaLR scheduler, gradient
accumulation, gradient clipping, gather_for_metrics. Rank 0 writes the final weights and the
losses it saw to OUT_FILE (torch.save). compat_tests/test_same_numbers.py runs it under the
real Accelerate and under accel (the import resolved to accel) and compares.
"""

import os
import sys

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

out, precision = sys.argv[1], sys.argv[2]
# The defaults unless told otherwise: "seedable" switches to the other shuffling mode.
seedable = sys.argv[3:] == ["seedable"]
set_seed(42)
g = torch.Generator().manual_seed(7)
features = torch.randn(96, 8, generator=g)
targets = (features @ torch.randn(8, 3, generator=g)).argmax(dim=1)

config = DataLoaderConfiguration(use_seedable_sampler=True) if seedable else None
accelerator = Accelerator(mixed_precision=precision, gradient_accumulation_steps=2, dataloader_config=config)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 6))
train = DataLoader(TensorDataset(features[:80], targets[:80]), batch_size=4, shuffle=True)
evaluate = DataLoader(TensorDataset(features[80:], targets[80:]), batch_size=5)
model, optimizer, scheduler, train, evaluate = accelerator.prepare(model, optimizer, scheduler, train, evaluate)

losses, accuracies = [], []
for _epoch in range(3):
    model.train()
    for x, y in train:
        with accelerator.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).float().mean().item())
    model.eval()
    correct = 0
    for x, y in evaluate:
        with torch.no_grad():
            predictions = model(x).argmax(dim=1)
        predictions, y = accelerator.gather_for_metrics((predictions, y))
        correct += int((predictions == y).sum())
    accuracies.append(correct)

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    weights = {k: v.detach().float().cpu() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    # Written whole or not at all: the test reads a file that exists as a finished run.
    partial = out + ".partial"
    torch.save({"weights": weights, "losses": losses, "accuracies": accuracies, "lr": scheduler.get_last_lr()}, partial)
    os.replace(partial, out)
accelerator.end_training()
