"""The fixture adapter's own kit extensions: a model for the emulation-decision check and a distributed check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def conv_with_adam() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def rank_sum(out: Path) -> dict[str, Any]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"sum": float(t)}
