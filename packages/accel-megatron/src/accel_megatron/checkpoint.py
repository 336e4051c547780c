"""Checkpoints: full TP/PP-merged weights for `save_model`, megatron-core distributed checkpoints for `save_state`.

Full weights are assembled from megatron-core's own sharding metadata (`sharded_state_dict`:
every shard's global shape and offset, and the layer's global index under pipeline
parallelism), so the result has the names and shapes of the same model built on one
process, whatever the tensor and pipeline layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from accel.errors import CheckpointError
from torch import nn

from .parallel import chunks_of

if TYPE_CHECKING:
    from accel.prepare.prepared import Prepared, RunContext

_MODELS = "megatron_models"
_MANIFEST = "megatron.json"
_RNG = "megatron_rng"


def _rng_file(directory: Path) -> Path:
    """This process's RNG-tracker file: one per (pipeline, tensor) rank, shared by its data-parallel replicas."""
    from megatron.core import parallel_state

    pp = parallel_state.get_pipeline_model_parallel_rank()
    tp = parallel_state.get_tensor_model_parallel_rank()
    return directory / _RNG / f"pp{pp:03d}_tp{tp:03d}.pt"


def save_rng_tracker(directory: Path) -> None:
    """Write megatron-core's model-parallel RNG tracker streams (dropout inside and outside TP regions).

    The tracker's streams differ per tensor-parallel rank and are equal across data-parallel
    replicas, so the first replica of each (pipeline, tensor) rank writes them.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    if parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0:
        path = _rng_file(directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        states = {
            name: state.detach().to("cpu", copy=True) for name, state in get_cuda_rng_tracker().get_states().items()
        }
        torch.save(states, path)


def load_rng_tracker(directory: Path) -> None:
    """Restore what `save_rng_tracker` wrote for this process's (pipeline, tensor) rank.

    Raises:
        CheckpointError: the checkpoint has no RNG-tracker state for this rank (saved with
            another tensor/pipeline layout).
    """
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    path = _rng_file(directory)
    if not path.is_file():
        raise CheckpointError(
            f"{directory} has no model-parallel RNG state for this process ({path.name}); it was saved with another "
            "tensor/pipeline layout. Resume with the same tp_degree and pp_degree."
        )
    states = torch.load(path, weights_only=True)
    tracker = get_cuda_rng_tracker()
    missing = set(tracker.get_states()) - set(states)
    if missing:
        raise CheckpointError(f"{path} lacks the RNG stream(s) {sorted(missing)}.")
    tracker.set_states(states)


def _global_name(local_key: str, offsets: tuple[int, ...]) -> str:
    """`decoder.layers.0.mlp...` on a later pipeline stage -> its global layer index."""
    if not offsets:
        return local_key
    parts, pending = local_key.split("."), list(offsets)
    for i, part in enumerate(parts):
        if pending and part.isdigit():
            parts[i] = str(pending.pop(0))
    return ".".join(parts)


def _shards(module: nn.Module) -> list[tuple[str, tuple[int, ...], tuple[int, ...], torch.Tensor]]:
    """(global name, global shape, offset, data) of the shards this process is the main copy of."""
    out = []
    for key, entry in _tensors(module):
        if entry.flattened_range is not None:
            continue
        replica = entry.replica_id if isinstance(entry.replica_id, tuple) else (entry.replica_id,)
        if any(replica):
            continue
        n = entry.prepend_axis_num
        name = _global_name(key, tuple(entry.global_offset[:n]))
        data = entry.data.detach().to("cpu", copy=True)
        out.append((name, tuple(entry.global_shape[n:]), tuple(entry.global_offset[n:]), data))
    return out


def _tensors(module: nn.Module) -> list[tuple[str, Any]]:
    """(state-dict key, `ShardedTensor`) of the module, with megatron-core's factories built (a SwiGLU
    `linear_fc1` is two: its gate and up halves, each sharded over the tensor-parallel group)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    out: list[tuple[str, Any]] = []
    for key, entry in module.sharded_state_dict().items():  # type: ignore[operator]
        if isinstance(entry, ShardedTensorFactory):
            out.extend((key, t) for t in entry.build() if isinstance(t, ShardedTensor))
        elif isinstance(entry, ShardedTensor):
            out.append((key, entry))
    return out


def _slices(offset: tuple[int, ...], shape: torch.Size) -> tuple[slice, ...]:
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def full_state_dict(modules: list[nn.Module]) -> dict[str, torch.Tensor]:
    """The full, unsharded state dict of this process's model chunks and every other process's, on every
    process (names of the one-process model).

    Collective over the world: every process must call it.
    """
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [shard for module in modules for shard in _shards(module)])
    full: dict[str, torch.Tensor] = {}
    for shards in everyone:
        for name, shape, offset, data in shards:
            target = full.setdefault(name, torch.empty(shape, dtype=data.dtype))
            target[_slices(offset, data.shape)] = data
    return dict(sorted(full.items()))


def load_full_state_dict(module: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full state dict (as `full_state_dict` returns) into this process's shards.

    Raises:
        KeyError: with `strict`, a weight of this shard is missing from `state_dict`.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    local = module.state_dict(keep_vars=True)
    for key, entry in module.sharded_state_dict().items():  # type: ignore[operator]
        if key not in local:
            continue
        # A factory (SwiGLU's fc1): its pieces cut from the full tensor, then merged as megatron-core loads them.
        parts = entry.build() if isinstance(entry, ShardedTensorFactory) else [entry]
        if not all(isinstance(p, ShardedTensor) for p in parts):
            continue
        n = parts[0].prepend_axis_num
        name = _global_name(key, tuple(parts[0].global_offset[:n]))
        if name not in state_dict:
            if strict:
                raise KeyError(f"{name} is missing from the state dict (strict=True).")
            continue
        pieces = [state_dict[name][_slices(tuple(p.global_offset[n:]), p.data.shape)] for p in parts]
        with torch.no_grad():
            local[key].copy_(entry.merge_fn(pieces) if isinstance(entry, ShardedTensorFactory) else pieces[0])


def _chunk_key(model: int, chunk: int) -> str:
    return f"model{model}" if chunk == 0 else f"model{model}_chunk{chunk}"


def _sharded(prepared: Prepared, *, loading: bool, optimizers: bool = True) -> dict[str, Any]:
    from megatron.core.distributed import DistributedDataParallel

    from .optim import MegatronOptimizer

    state: dict[str, Any] = {}
    model_states: dict[str, Any] = {}
    for i, model in enumerate(prepared.models):
        for j, chunk in enumerate(chunks_of(model)):
            inner = chunk.module if isinstance(chunk, DistributedDataParallel) else chunk
            # Chunks share key names (megatron-core tells their layers apart by global offsets), so
            # each chunk is its own entry, as in megatron-core's training loop.
            model_states[_chunk_key(i, j)] = inner.sharded_state_dict(prefix=f"model{i}.")  # type: ignore[operator]
    state.update(model_states)
    merged = model_states
    for i, opt in enumerate(prepared.optimizers if optimizers else []):
        inner_opt = opt.optimizer
        if not isinstance(inner_opt, MegatronOptimizer):
            raise CheckpointError(f"Optimizer {i} is not megatron-core's; prepare it with the megatron strategy.")
        state[f"optimizer{i}"] = inner_opt.inner.sharded_state_dict(merged, is_loading=loading)
    return state


def save(prepared: Prepared, ctx: RunContext, directory: Path, *, optimizer_state: bool = True) -> list[str]:
    """Write every prepared model and optimizer with megatron-core's distributed checkpointing, and the
    model-parallel RNG tracker's streams (exact resume with dropout under tensor parallelism).

    `optimizer_state=False` (the plugin's `no_save_optim`): the optimizers' state is left out.
    """
    from megatron.core import dist_checkpointing

    folder = directory / _MODELS
    if ctx.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        manifest = {"models": len(prepared.models), "optimizers": len(prepared.optimizers)}
        (directory / _MANIFEST).write_text(json.dumps(manifest | {"optimizer_state": optimizer_state}))
    dist.barrier()
    dist_checkpointing.save(_sharded(prepared, loading=False, optimizers=optimizer_state), str(folder))
    save_rng_tracker(directory)
    return [_MODELS, _MANIFEST, _RNG]


def load(prepared: Prepared, directory: Path, *, strict: bool, optimizer_state: bool = True) -> None:
    """Restore what `save` wrote, into the same tensor/pipeline layout.

    `optimizer_state=False` (the plugin's `no_load_optim`): the optimizers are left as they are.

    Raises:
        CheckpointError: the directory has no megatron-core checkpoint, a different count of
            models or optimizers, or no optimizer state where it is to be loaded.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.distributed import DistributedDataParallel

    folder = directory / _MODELS
    manifest = directory / _MANIFEST
    if not folder.is_dir() or not manifest.is_file():
        raise CheckpointError(f"{directory} holds no megatron-core checkpoint ({_MODELS}/ and {_MANIFEST}).")
    counts = json.loads(manifest.read_text())
    saved_optimizer = counts.pop("optimizer_state", True)
    if optimizer_state and not saved_optimizer and prepared.optimizers:
        raise CheckpointError(
            f"{directory} was saved without optimizer state (no_save_optim=True); load it with "
            "MegatronPlugin(no_load_optim=True)."
        )
    if counts != {"models": len(prepared.models), "optimizers": len(prepared.optimizers)}:
        raise CheckpointError(
            f"{directory} was saved with {counts}, but {len(prepared.models)} model(s) and "
            f"{len(prepared.optimizers)} optimizer(s) are prepared."
        )
    loaded = dist_checkpointing.load(_sharded(prepared, loading=True, optimizers=optimizer_state), str(folder))
    for i, model in enumerate(prepared.models):
        for j, chunk in enumerate(chunks_of(model)):
            inner = chunk.module if isinstance(chunk, DistributedDataParallel) else chunk
            state = {k.removeprefix(f"model{i}."): v for k, v in loaded[_chunk_key(i, j)].items()}
            inner.load_state_dict(state, strict=strict)
    for i, opt in enumerate(prepared.optimizers if optimizer_state else []):
        opt.optimizer.inner.load_state_dict(loaded[f"optimizer{i}"])
    if (directory / _RNG).is_dir():  # checkpoints from before the tracker was saved have none
        load_rng_tracker(directory)
