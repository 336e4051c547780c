"""The example adapter's own additions to the conformance kit (named in tests/test_conformance.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def model_with_adamw() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """For the emulation-decision check: the adapter's fused-AdamW decision shows in the record."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def fused_adamw_trains(out: Path) -> dict[str, Any]:
    """A distributed check of the adapter's own: fused AdamW through prepare, weights equal on every rank."""
    from accel import Accelerator

    acc = Accelerator()
    torch.manual_seed(0)
    model, opt = acc.prepare(*model_with_adamw())
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(acc.process_index))
    for _ in range(3):
        acc.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    every_rank = acc.gather(weights[None])
    return {
        "fused": bool(opt.param_groups[0]["fused"]),
        "same_on_every_rank": all(torch.equal(w, weights) for w in every_rank),
    }
