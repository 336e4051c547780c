"""Accelerate's Megatron-LM loss and gather helpers, over megatron-core's data-parallel group."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from accel.distributed.ops import recursively_apply


def _group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """Each loss of `losses` averaged over the data-parallel replicas (one tensor, one entry per loss), as
    Megatron-LM's `average_losses_across_data_parallel_group`; tensor- and pipeline-parallel ranks of one
    replica are not counted twice."""
    averaged = torch.cat([loss.detach().clone().float().reshape(1) for loss in losses])
    dist.all_reduce(averaged, group=_group())
    return averaged / dist.get_world_size(group=_group())


def gather_across_data_parallel_groups(tensor: Any) -> Any:
    """Every data-parallel replica's `tensor` (nested lists/tuples/dicts of tensors), concatenated along dim 0
    in replica order (scalars become one entry each)."""

    def gather_one(t: torch.Tensor) -> torch.Tensor:
        if t.ndim == 0:
            t = t.clone()[None]
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group=_group()))]
        dist.all_gather(parts, t.contiguous(), group=_group())
        return torch.cat(parts, dim=0)

    return recursively_apply(gather_one, tensor)
