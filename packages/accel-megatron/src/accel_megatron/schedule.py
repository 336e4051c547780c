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

    def forward_step(data_iterator: Any, stage: nn.Module) -> tuple[torch.Tensor, Callable[..., Any]]:
        micro_batch = next(data_iterator)
        output = forward_fn(stage, micro_batch)

        def loss_func(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if outputs is not None:
                outputs.append(output_tensor.detach().clone())
            loss = loss_fn(output_tensor, micro_batch)
            return loss, {"loss": loss.detach().float().mean()}  # a scalar, whatever shape loss_fn returns

        return output, loss_func

    # The only scalar reported: the step's loss is its mean over the micro-batches.
    loss, _ = run_forward_step(
        chunks, batch, forward_step, num_micro_batches, forward_only=forward_only, seq_length=seq_length
    )
    return loss


def _schedule(
    chunks: list[nn.Module],
    micro_batches: list[Any],
    forward_step: Callable[..., Any],
    *,
    forward_only: bool,
    seq_length: int | None,
) -> list[dict[str, Any]]:
    """megatron-core's forward-backward function over `micro_batches`; the last stage's loss dicts."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    # One iterator per model chunk: under the interleaved schedule every chunk draws each micro-batch.
    queues = [iter(micro_batches) for _ in chunks]
    micro_batch_size, batch_seq = _shape(micro_batches[0])
    return get_forward_backward_func()(  # type: ignore[no-any-return]
        forward_step_func=forward_step,
        data_iterator=queues if len(chunks) > 1 else queues[0],
        model=chunks,
        num_microbatches=len(micro_batches),
        seq_length=seq_length or batch_seq,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )


def _from_last_stage(value: torch.Tensor) -> torch.Tensor:
    """`value` of the last pipeline stage on every stage (only the last stage computes the loss)."""
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        group = parallel_state.get_pipeline_model_parallel_group()
        dist.broadcast(value, src=parallel_state.get_pipeline_model_parallel_last_rank(), group=group)
    return value


def run_forward_step(
    chunks: list[nn.Module],
    batch: Any,
    forward_step: Callable[[Any, nn.Module], tuple[Any, Callable[..., Any]]],
    num_micro_batches: int,
    *,
    forward_only: bool = False,
    seq_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron-LM's train-step protocol: `forward_step(data_iterator, model) -> (output, loss_func)`, with
    `loss_func(output) -> (loss, {name: value})`, over the batch's micro-batches (one iterator per chunk).

    Returns Accelerate's reduction, from the last stage: each scalar of the loss dicts averaged over the
    micro-batches, other tensors (e.g. "logits") concatenated; and the step's loss, the sum of those scalars, on
    every pipeline stage (the dict is empty on the others).
    """
    micro_batches = split_micro_batches(batch, num_micro_batches)

    def reported(data_iterator: Any, model: nn.Module) -> tuple[Any, Callable[..., Any]]:
        output, loss_func = forward_step(data_iterator, model)

        def loss_and_report(output_tensor: Any) -> Any:
            result = loss_func(output_tensor)
            # Copies: megatron-core divides the returned loss by the micro-batch count in place, which would also
            # halve a reported value that is a view of it (`{"lm loss": loss.detach()}`).
            report = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in result[-1].items()}
            return (*result[:-1], report)

        return output, loss_and_report

    entries = _schedule(chunks, micro_batches, reported, forward_only=forward_only, seq_length=seq_length)
    reduced: dict[str, torch.Tensor] = {}
    for key in entries[0] if entries else {}:
        values = [entry[key] for entry in entries]
        if values[0].dim() == 0:
            reduced[key] = torch.stack([v.float() for v in values]).mean()
        else:
            reduced[key] = torch.cat(values)
    total = torch.zeros((), dtype=torch.float32)
    for value in reduced.values():
        if value.dim() == 0:
            total = total + value.detach().float().cpu()
    return _from_last_stage(total), reduced
