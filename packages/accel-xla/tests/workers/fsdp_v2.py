"""xla_fsdp_v2 on torch_xla's CPU device (1-device mesh) against the same loop in plain torch on the CPU.

Prints one JSON line: the losses of both runs, the wrapper's type, the parameters' sharding
spec, and whether the saved weights have the unwrapped model's names. argv: OUT_DIR. The
strategy comes from ACCEL_STRATEGY, as `accel launch --strategy xla_fsdp_v2` sets it.
"""

import copy
import json
import sys
from pathlib import Path

import torch
from accel import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    out = Path(sys.argv[1])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = copy.deepcopy(reference)

    accelerator = Accelerator()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=8))
    losses = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    expected = []
    for xb, yb in DataLoader(data, batch_size=8):
        loss = torch.nn.functional.mse_loss(reference(xb), yb)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        expected.append(loss.item())
    weights = accelerator.get_state_dict(model)
    accelerator.save_model(model, out / "export")
    result = {
        "expected": expected,
        "losses": losses,
        "wrapper": type(model).__name__,
        "strategy": accelerator.strategy.name,
        "sharding": __import__("torch_xla")._XLAC._get_xla_sharding_spec(next(model.parameters())),
        "names": sorted(weights) == sorted(reference.state_dict()),
        "weights_close": all(
            torch.allclose(weights[k].cpu(), v, rtol=1e-4, atol=1e-5) for k, v in reference.state_dict().items()
        ),
        "exported": sorted(p.name for p in (out / "export").iterdir()),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
