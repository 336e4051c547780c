"""One batch through megatron-core's forward-backward schedule (pipelined when pp_degree > 1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from accel.distributed.ops import recursively_apply
from torch import nn


def split_micro_batches(batch: Any, num_micro_batches: int) -> list[Any]:
    """`batch` cut into `num_micro_batches` equal pieces along dim 0 of every tensor.

    Raises:
        ValueError: the batch size is not a multiple of `num_micro_batches`.
    """
    sizes = set()
    recursively_apply(lambda t: sizes.add(t.shape[0]), batch)
    if len(sizes) != 1:
        raise ValueError(
            f"Every tensor of a batch needs the same size in dim 0 to split it; got sizes {sorted(sizes)}."
        )
    size = sizes.pop()
    if size % num_micro_batches:
        raise ValueError(
            f"A batch of {size} cannot be split into num_micro_batches={num_micro_batches} equal micro-batches; "
            "make the loader's batch size a multiple of it."
        )
    step = size // num_micro_batches
    return [recursively_apply(lambda t, i=i: t[i * step : (i + 1) * step], batch) for i in range(num_micro_batches)]


def _shape(micro_batch: Any) -> tuple[int, int]:
    """(micro-batch size, sequence length): megatron-core sizes its pipeline messages from them."""
    first: list[torch.Tensor] = []
    recursively_apply(first.append, micro_batch)
    t = first[0]
    return int(t.shape[0]), int(t.shape[1]) if t.ndim > 1 else 1


def run(
    chunks: list[nn.Module],
    batch: Any,
    forward_fn: Callable[[nn.Module, Any], torch.Tensor],
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor],
    num_micro_batches: int,
    *,
    forward_only: bool = False,
    seq_length: int | None = None,
    outputs: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Run the schedule; returns the mean micro-batch loss on every pipeline stage.

    `seq_length`: the sequence length of the activations passed between stages (default:
    dim 1 of the batch's first tensor). `outputs`: a list that receives the last stage's output
    of every micro-batch (detached), in order.
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    micro_batches = split_micro_batches(batch, num_micro_batches)
    # One iterator per model chunk: under the interleaved schedule every chunk draws each micro-batch.
    queues = [iter(micro_batches) for _ in chunks]

    def forward_step(data_iterator: Any, stage: nn.Module) -> tuple[torch.Tensor, Callable[..., Any]]:
        micro_batch = next(data_iterator)
        output = forward_fn(stage, micro_batch)

        def loss_func(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if outputs is not None:
                outputs.append(output_tensor.detach().clone())
            loss = loss_fn(output_tensor, micro_batch)
            # A copy: megatron-core divides the returned loss by the micro-batch count in place.
            return loss, {"loss": loss.detach().clone()}

        return output, loss_func

    micro_batch_size, batch_seq = _shape(micro_batches[0])
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=queues if len(chunks) > 1 else queues[0],
        model=chunks,
        num_microbatches=num_micro_batches,
        seq_length=seq_length or batch_seq,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )
    mean = torch.zeros((), dtype=torch.float32)
    if losses:
        mean = torch.stack([entry["loss"].float().cpu() for entry in losses]).mean()
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        # Only the last stage computes the loss; every stage returns it.
        group = parallel_state.get_pipeline_model_parallel_group()
        dist.broadcast(mean, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=group)
    return mean
