"""Local SGD: each process trains on its own for a number of steps, then the model weights are averaged.

Accelerate's `accelerate.local_sgd.LocalSGD`, on any adapter's data parallelism (the strategy's
`no_sync` pauses the gradient all-reduce, whatever reduces gradients on that hardware):

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(loss_fn(model(batch)))
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()

Weights are averaged every `local_sgd_steps` calls of `step()` and once more when the context
exits. Only each process's copy of the weights is averaged (optimizer state stays local), as in
Accelerate.
"""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import torch

from .distributed.distributed_type import DistributedType

UNSUPPORTED = "LocalSGD is supported only for CPUs and GPUs (no DeepSpeed or MegatronLM)"
"""Accelerate 1.15's message for a run whose model is not plain data parallel."""


class LocalSGD:
    """Run `local_sgd_steps` optimizer steps without synchronising gradients, then average the weights.

    Args:
        accelerator: the run's `Accelerator`.
        model: the prepared model whose weights are averaged.
        local_sgd_steps: how many `step()` calls between two averagings (an int >= 1).
        enabled: False turns every call into a no-op (as does a run with one process).

    Raises:
        NotImplementedError: the run shards or splits the model (FSDP, DeepSpeed, Megatron-LM, tensor
            parallelism): its weights are not whole replicas to average (Accelerate's message).
        ValueError: `local_sgd_steps` is not an int >= 1.
    """

    def __init__(self, accelerator: Any, model: torch.nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        distributed_type = accelerator.distributed_type
        data_parallel = accelerator.adapter.data_parallel_type(accelerator.use_distributed)
        pc = accelerator.parallelism_config
        splits = pc is not None and (pc.tp_enabled or pc.cp_enabled or pc.dp_shard_enabled)
        if distributed_type not in (DistributedType.NO, data_parallel) or splits:
            raise NotImplementedError(UNSUPPORTED)
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(
                f"local_sgd_steps must be an int >= 1 (the optimizer steps between two averagings of the weights), "
                f"got {local_sgd_steps!r}."
            )
        self.enabled = bool(enabled) and distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: contextlib.AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.enabled and self._no_sync is not None:
            try:
                if exc_type is None:  # on an error the peers may not reach the averaging: do not wait for them
                    self._sync_and_avg_model_params()
            finally:
                no_sync, self._no_sync = self._no_sync, None
                no_sync.__exit__(exc_type, exc, tb)

    def step(self) -> None:
        """Count one optimizer step; every `local_sgd_steps`-th call averages the weights over the processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean over the processes (one reduction per parameter, in model order)."""
        self.accelerator.wait_for_everyone()
        with torch.no_grad():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")
