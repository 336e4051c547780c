"""Quickstart: a small regression model trained on 2 processes, written as for Accelerate.

Run it with:  accel launch --num-processes 2 examples/quickstart.py
Only the import differs from an Accelerate script.
"""

import sys

import torch
from accel import Accelerator
from accel.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

try:  # a progress bar on a terminal when tqdm is installed; plain lines otherwise
    from tqdm import tqdm
except ImportError:
    tqdm = None


def make_data(n_train: int = 512, n_eval: int = 100, features: int = 16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n_train + n_eval, features, generator=g)
    true_w = torch.randn(features, 1, generator=g)
    y = x @ true_w + 0.01 * torch.randn(n_train + n_eval, 1, generator=g)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


def main() -> None:
    accelerator = Accelerator()
    set_seed(42)
    train_set, eval_set = make_data()
    train = DataLoader(train_set, batch_size=32, shuffle=True)
    evaluation = DataLoader(eval_set, batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=40, gamma=0.5)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation, scheduler)

    epochs = 5
    # On a terminal: one bar on the main process. Piped or logged: one line per step, flushed
    # at once so `accel launch ... | tee log` shows progress as it happens.
    bar = (
        tqdm(total=epochs * len(train), disable=not accelerator.is_main_process)
        if tqdm and sys.stdout.isatty()
        else None
    )
    for epoch in range(epochs):
        model.train()
        total = torch.zeros((), device=accelerator.device)
        for step, (x, y) in enumerate(train, start=1):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            total += loss.detach()
            if bar is not None:
                bar.set_postfix(epoch=epoch, loss=f"{loss.item():.4f}")
                bar.update()
            else:
                accelerator.print(
                    f"  epoch {epoch} step {step}/{len(train)}: loss {loss.item():.4f} (process 0's batch)", flush=True
                )
        mean_loss = accelerator.reduce(total / len(train), reduction="mean")
        accelerator.print(f"epoch {epoch}: train loss {mean_loss.item():.4f}", flush=True)
    if bar is not None:
        bar.close()

    model.eval()
    errors = []
    with torch.no_grad():
        for x, y in evaluation:
            errors.append(accelerator.gather_for_metrics((model(x) - y).pow(2)))
    errors = torch.cat(errors)
    accelerator.print(f"eval: {errors.shape[0]} samples, mse {errors.mean().item():.4f}", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
