"""`accel test`: a 2-process self-check of the installation, run through `accel launch`.

Each check compares with a value computed another way; the first failure exits non-zero.
"""

from __future__ import annotations

import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..accelerator import Accelerator
from ..utils import set_seed


def _check(name: str, ok: bool, accelerator: Accelerator) -> None:
    if not ok:
        print(f"[rank {accelerator.process_index}] FAILED: {name}", file=sys.stderr, flush=True)
        sys.exit(1)
    accelerator.print(f"ok  {name}")


def main() -> None:
    accelerator = Accelerator()
    accelerator.print(accelerator.state)
    n, rank = accelerator.num_processes, accelerator.process_index

    t = torch.tensor([float(rank)], device=accelerator.device)
    _check("gather", accelerator.gather(t).tolist() == [float(r) for r in range(n)], accelerator)
    _check("reduce", float(accelerator.reduce(t, "sum")) == sum(range(n)), accelerator)

    set_seed(0)
    data = torch.arange(20, dtype=torch.float32).unsqueeze(1)
    loader = DataLoader(TensorDataset(data, 2 * data), batch_size=3, shuffle=True)
    net = torch.nn.Linear(1, 1)
    model, optimizer, loader = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=1e-3), loader)

    seen = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        seen.append(accelerator.gather_for_metrics(x))
    gathered = torch.cat(seen).flatten().sort().values
    _check(
        "gather_for_metrics sees every sample exactly once", gathered.tolist() == data.flatten().tolist(), accelerator
    )

    _check("unwrap_model returns the user's module", accelerator.unwrap_model(model) is net, accelerator)
    weights = accelerator.gather(net.weight.detach().flatten())
    _check("replicas identical after training", bool((weights == weights[0]).all()), accelerator)
    accelerator.wait_for_everyone()
    accelerator.print(f"accel self-check passed on {n} process(es) with {accelerator.adapter.describe()}")


if __name__ == "__main__":
    main()
