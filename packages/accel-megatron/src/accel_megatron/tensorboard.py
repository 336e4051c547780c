"""Megatron-LM's TensorBoard scalars (`MegatronPlugin.tensorboard_dir`), as its `training_log` writes them
after each optimizer step under the logging options Accelerate sets (`set_all_logging_options`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .plugin import MegatronConfigError, MegatronPlugin

if TYPE_CHECKING:
    from .optim import MegatronOptimizer

# torch.cuda.memory_stats() keys of Megatron-LM's `--log-memory-to-tensorboard` scalars.
_MEMORY = {
    "mem-reserved-bytes": "reserved_bytes.all.current",
    "mem-allocated-bytes": "allocated_bytes.all.current",
    "mem-max-allocated-bytes": "allocated_bytes.all.peak",
    "mem-allocated-count": "allocation.all.current",
}


def params_l2_norm(models: list[torch.nn.Module], bf16: bool = False) -> float:
    """The L2 norm of the whole model's parameters, as Megatron-LM's `--log-params-norm` reports it: each
    parameter once over every tensor-, pipeline- and expert-parallel shard (tensor-parallel duplicates such
    as layer-norm weights and the last stage's copy of a tied embedding are left out), from the fp32 main
    parameters under bf16 (sharded over the data-parallel group by the distributed optimizer).

    A collective over the model-parallel groups: every process calls it.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    # Sums of squares: dense parameters, expert parameters, main parameters sharded over data parallelism.
    dense, expert, sharded = torch.zeros(1), torch.zeros(1), torch.zeros(1)
    device = None
    for model in models:
        for param in model.parameters():
            device = device or param.device
            if not param_is_not_tensor_parallel_duplicate(param) or not param_is_not_shared(param):
                continue
            main = getattr(param, "main_param", None) if bf16 else None
            if bf16 and getattr(param, "main_param_sharded", False):
                if main is not None:
                    sharded += main.detach().float().pow(2).sum().cpu()
                continue
            data = (main if main is not None else param).detach().float()
            target = dense if getattr(param, "allreduce", True) else expert
            target += data.pow(2).sum().cpu()
    # gloo reduces CPU tensors; NCCL needs them on the device.
    on = device if device is not None and device.type == "cuda" else torch.device("cpu")
    dense, expert, sharded = dense.to(on), expert.to(on), sharded.to(on)
    if dist.is_initialized():
        dist.all_reduce(sharded, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
        dense += sharded
        dist.all_reduce(dense, group=parallel_state.get_model_parallel_group())
        dist.all_reduce(expert, group=parallel_state.get_expert_tensor_model_pipeline_parallel_group())
    else:
        dense += sharded
    return float(dense + expert) ** 0.5


def perplexity(loss: float) -> float:
    """Megatron-LM's validation perplexity: exp of the loss, capped at e^20."""
    return math.exp(min(20.0, loss))


class TensorBoardLog:
    """Megatron-LM's training scalars, after every optimizer step, written by the last process (Megatron-LM's
    writer); built on every process, since some scalars are collectives (the data-parallel mean loss, the
    parameter norm).

    Always: "lm loss", "learning-rate", "batch-size", "loss-scale", "grad-norm" (unless the step was skipped),
    each also "... vs samples" (x axis: consumed samples). With `set_all_logging_options` (Accelerate's
    `set_tensorboard_logging_options`): "world-size", "num-zeros", "params-norm" (each with "vs samples"),
    "iteration-time" (seconds per step, `--log-timers-to-tensorboard`), and on CUDA the allocator's
    "mem-*" statistics (`--log-memory-to-tensorboard`; not written elsewhere: there are none).
    """

    def __init__(self, directory: str | None, everything: bool, consumed_samples: int = 0) -> None:
        self.writer: Any = None
        """The SummaryWriter (last process only)."""
        if directory is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=directory)
        self.everything = everything
        self.consumed_samples = consumed_samples
        """Megatron-LM's `consumed_train_samples`: the x axis of the "vs samples" scalars."""
        self.batch_size: Callable[[], int | None] = lambda: None
        """Samples per optimizer step over every replica (Megatron-LM's global batch size); set by the
        strategy from the train loader. None (unknown: no loader prepared) leaves out "batch-size" and every
        "vs samples" scalar."""
        self._samples_known = False
        self._since = time.perf_counter()

    @classmethod
    def create(cls, plugin: MegatronPlugin) -> TensorBoardLog | None:
        """None without `tensorboard_dir`.

        Raises:
            MegatronConfigError: the tensorboard package is missing.
        """
        import torch.distributed as dist

        if plugin.tensorboard_dir is None:
            return None
        world = dist.get_world_size() if dist.is_initialized() else 1
        last = (dist.get_rank() if dist.is_initialized() else 0) == world - 1
        consumed = int((plugin.consumed_samples or [0])[0])
        try:
            return cls(plugin.tensorboard_dir if last else None, plugin.set_all_logging_options, consumed)
        except ImportError:
            raise MegatronConfigError(
                "MegatronPlugin.tensorboard_dir needs the tensorboard package: pip install tensorboard"
            ) from None

    def _add(self, name: str, value: float, step: int, *, vs_samples: bool = True) -> None:
        self.writer.add_scalar(name, value, step)
        if vs_samples and self._samples_known:
            self.writer.add_scalar(f"{name} vs samples", value, self.consumed_samples)

    def log(self, optimizer: MegatronOptimizer, zeros: Any, loss: float | None = None) -> None:
        """This step's scalars (every process calls it: the parameter norm is a collective)."""
        import torch.distributed as dist

        batch = self.batch_size()
        self._samples_known = batch is not None
        self.consumed_samples += batch or 0
        params_norm = params_l2_norm(optimizer.models, optimizer.inner.config.bf16) if self.everything else None
        if self.writer is None:
            return
        now = time.perf_counter()
        elapsed, self._since = now - self._since, now
        step = optimizer.iteration
        group = next((g for g in optimizer.param_groups if g.get("default_config", True)), optimizer.param_groups[0])
        self._add("learning-rate", float(group["lr"]), step)
        if batch is not None:
            self._add("batch-size", float(batch), step)
        if loss is not None:
            self._add("lm loss", loss, step)
        self._add("loss-scale", float(optimizer.inner.get_loss_scale()), step)
        if self.everything:
            self._add("world-size", float(dist.get_world_size() if dist.is_initialized() else 1), step)
        if optimizer.grad_norm is not None:
            self._add("grad-norm", optimizer.grad_norm, step)
        if self.everything and zeros is not None:
            self._add("num-zeros", float(zeros), step)
        if params_norm is not None:
            self._add("params-norm", params_norm, step)
        if self.everything and optimizer.models and next(optimizer.models[0].parameters()).is_cuda:
            stats = torch.cuda.memory_stats()
            for name, key in _MEMORY.items():
                if key in stats:
                    self._add(name, float(stats[key]), step, vs_samples=False)
        if self.everything:
            self._add("iteration-time", elapsed, step, vs_samples=False)
        self.writer.flush()

    def log_eval(self, results: dict[str, float], step: int) -> None:
        """Megatron-LM's validation scalars: "{name} validation" and "{name} validation ppl" (exp of the loss,
        capped at e^20), each also "vs samples"."""
        if self.writer is None:
            return
        for name, value in results.items():
            self._add(f"{name} validation", float(value), step)
            self._add(f"{name} validation ppl", perplexity(float(value)), step)
        self.writer.flush()
