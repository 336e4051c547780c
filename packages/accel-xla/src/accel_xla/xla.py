"""Every call this package makes into torch_xla, and nothing else.

Imported only when the adapter runs on an XLA device; it imports torch_xla at the top, so
importing it where torch_xla is missing fails at once. Under emulation
`accel_xla.xla_emulated` replaces it function for function: keep the two in step.

Only torch_xla's current API is used: `torch_xla.device()` and `torch_xla.sync()` (not the
deprecated `xm.xla_device()` / `xm.mark_step()`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr

COMPILE_BACKEND = "openxla"
"""The torch.compile backend of XLA devices (torch's dynamo backend that hands graphs to torch_xla)."""
COMPILE_BACKENDS = frozenset({COMPILE_BACKEND})
"""The torch.compile backends that run on XLA devices: inductor generates CPU/GPU kernels, not XLA graphs."""


def register_backend() -> None:
    """Register the `xla` backend with torch.distributed (an import side effect).

    Its process group runs every collective as an XLA collective with `pin_layout=False`:
    with pinned layouts `all_gather` compiles a different graph on each replica.
    """
    import torch_xla.distributed.xla_backend  # noqa: F401


def device() -> torch.device:
    """This process's XLA device."""
    return torch.device(torch_xla.device())


def device_kind() -> str:
    """The PJRT device kind: "TPU", "CPU", "CUDA", ..."""
    return str(xr.device_type())


def sync() -> None:
    """Cut the traced graph here: compile it (once per distinct graph) and run it."""
    torch_xla.sync()


def barrier() -> None:
    """Wait for every replica. The `xla` process group's own barrier returns at once, so
    `wait_for_everyone` would not wait; torch_xla's rendezvous does."""
    xm.rendezvous("accel.wait_for_everyone")


def all_reduce_mean(tensors: list[torch.Tensor]) -> None:
    """Average `tensors` in place across replicas (nothing with one), as one XLA all-reduce."""
    count = int(xr.world_size())
    if count > 1 and tensors:
        xm.all_reduce(xm.REDUCE_SUM, tensors, scale=1.0 / count)


def broadcast_master_params(model: torch.nn.Module) -> None:
    """Every replica takes replica 0's parameters (what DDP does at construction)."""
    if int(xr.world_size()) > 1:
        xm.broadcast_master_param(model)


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average the optimizer's gradients across replicas (`xm.reduce_gradients`: the reducing half of
    `xm.optimizer_step`, for a step whose gradients nothing averaged yet)."""
    xm.reduce_gradients(optimizer)


def step_only(optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
    """Step without reducing (the strategy averaged the gradients: after backward, before clipping, or right
    before the step through `reduce_gradients`)."""
    return optimizer.step(closure) if closure is not None else optimizer.step()


_shard_batches = [True]


def shard_batches(on: bool) -> None:
    """Whether `device_loader` splits batches over the "fsdp" axis under SPMD (xla_fsdp_v2's `shard_inputs`;
    SPMD, and so this setting, belongs to the whole process)."""
    _shard_batches[0] = bool(on)


def device_loader(batches: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """torch_xla's parallel device loader over `batches`: a background thread moves upcoming
    batches to `device` while the current step runs, and the loader cuts the graph (`sync`)
    before handing out each batch.

    Under SPMD (unless `shard_batches(False)`) every tensor of a batch is split along its first (batch)
    dimension over the "fsdp" axis of the global mesh (`MpDeviceLoader(input_sharding=...)`), so each
    device holds and computes its part of the batch only.
    """
    sharding = _BatchSharding(global_mesh()) if xr.is_spmd() and _shard_batches[0] else None
    return iter(pl.MpDeviceLoader(_Once(batches), device, input_sharding=sharding))


class _BatchSharding:
    """`input_sharding` for batches of tensors of any rank: dimension 0 over "fsdp", the rest replicated
    (torch_xla's `ShardingSpec` fits one rank only; this picks the one for each tensor)."""

    minibatch = False

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh
        self._specs: dict[int, Any] = {}

    def xla_spec(self, tensor: torch.Tensor) -> Any:
        import torch_xla.distributed.spmd as xs

        rank = tensor.dim()
        if rank == 0:
            return None
        if rank not in self._specs:
            self._specs[rank] = xs.ShardingSpec(self.mesh, ("fsdp",) + (None,) * (rank - 1))
        return self._specs[rank].xla_spec(tensor)


class _Once:
    """A one-shot iterable (ParallelLoader calls `iter()` on what it is given, once)."""

    def __init__(self, batches: Iterable[Any]) -> None:
        self._batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self._batches)


def get_rng_state() -> int:
    """The XLA device's RNG seed (XLA keeps one integer per device)."""
    return int(xm.get_rng_state())


def set_rng_state(state: int) -> None:
    xm.set_rng_state(int(state))


def manual_seed(seed: int) -> None:
    xm.set_rng_state(int(seed))


def counters() -> dict[str, int]:
    """How many graphs were compiled and executed so far (torch_xla's own metrics).

    Waits for queued executions first: they run asynchronously and are counted when they finish.
    """
    xm.wait_device_ops()
    compiled = met.metric_data("CompileTime")
    executed = met.metric_data("ExecuteTime")
    return {"compilations": int(compiled[0]) if compiled else 0, "executions": int(executed[0]) if executed else 0}


def use_spmd() -> None:
    """Turn torch_xla's SPMD mode on (every device of this host becomes one virtual device).

    Must run before the runtime starts (`torch_xla.device()`): turned on later, torch_xla
    replicates what exists and a training step then crashed its CPU runtime (torch_xla 2.9).
    """
    xr.use_spmd()


def spmd_mode() -> str:
    """ "on"; "free" (off, and the runtime has not started: `use_spmd` may still run); "too late"."""
    if xr.is_spmd():
        return "on"
    return "too late" if torch_xla._XLAC._xla_get_spmd_config_is_locked() else "free"


def global_mesh() -> Any:
    """The global SPMD mesh (SPMD turned on if it is not yet, see `use_spmd`): the script's
    (`torch_xla.distributed.spmd.set_global_mesh`), else a new one of every device of the runtime, axes
    ("fsdp", "model") of shape (devices, 1), set as the global mesh.

    Raises:
        ValueError: the script's global mesh has no "fsdp" axis.
    """
    import numpy as np
    import torch_xla.distributed.spmd as xs

    xr.use_spmd()
    mesh = xs.get_global_mesh()
    if mesh is None:
        count = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(count), (count, 1), ("fsdp", "model"))
        xs.set_global_mesh(mesh)
    elif "fsdp" not in mesh.axis_names:
        raise ValueError(
            f"The global SPMD mesh has axes {tuple(mesh.axis_names)}; the xla_fsdp_v2 strategy shards along an axis "
            "named 'fsdp'. Name one of its axes 'fsdp' in torch_xla.distributed.spmd.Mesh(...)."
        )
    return mesh


def mesh_shape() -> dict[str, int]:
    """The global mesh's axes and their sizes."""
    mesh = global_mesh()
    return {str(name): int(size) for name, size in zip(mesh.axis_names, mesh.mesh_shape)}


def fsdp_v2_wrap(
    model: torch.nn.Module,
    *,
    auto_wrap_policy: Any = None,
    shard_output: Any = None,
    gradient_checkpointing: bool = False,
) -> torch.nn.Module:
    """The model under torch_xla's SPMD FSDP (FSDPv2, `SpmdFullyShardedDataParallel`) over `global_mesh()`.

    Each unit's parameters are sharded along the "fsdp" axis (each on its largest dimension).
    `auto_wrap_policy` (torch_xla's policy signature: module, recurse, unwrapped_params): the
    submodules it selects become units of their own, the rest belongs to the root unit.
    `shard_output(output, mesh)` marks the sharding of each unit's output. With
    `gradient_checkpointing` each unit's forward is recomputed in backward
    (`torch_xla.distributed.fsdp.checkpoint_module`, i.e. `torch_xla.utils.checkpoint`).
    """
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    mesh = global_mesh()
    wrapper: Any = None
    if gradient_checkpointing:

        def wrapper(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
            return FSDPv2(checkpoint_module(module), *args, **kwargs)

    return FSDPv2(
        model, mesh=mesh, shard_output=shard_output, auto_wrap_policy=auto_wrap_policy, auto_wrapper_callable=wrapper
    )


def mark_batch_sharding(tensor: torch.Tensor, mesh: Any) -> None:
    """Shard `tensor` along its first dimension over the "fsdp" axis (the rest replicated)."""
    import torch_xla.distributed.spmd as xs

    if tensor.dim() > 0:
        xs.mark_sharding(tensor, mesh, ("fsdp",) + (None,) * (tensor.dim() - 1))


def wrap_policies() -> dict[str, Any]:
    """torch_xla's auto-wrap policies by name: "transformer" (`transformer_layer_cls`), "size" (`min_num_params`)."""
    from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    return {"transformer": transformer_auto_wrap_policy, "size": size_based_auto_wrap_policy}


def is_fsdp_v2(model: torch.nn.Module) -> bool:
    """Whether `model` is torch_xla's SPMD FSDP wrapper."""
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    return isinstance(model, SpmdFullyShardedDataParallel)


def sharding_spec(tensor: torch.Tensor) -> str:
    """The tensor's SPMD sharding ("" when none is set; "{replicated}"; "{devices=[4,1]0,1,2,3}")."""
    return str(torch_xla._XLAC._get_xla_sharding_spec(tensor))


def local_shard_bytes(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes each device holds of `tensors` (their local shards, padding included; a replicated tensor whole)."""
    held: dict[str, int] = {}
    for shards in torch_xla._XLAC._get_local_shards(list(tensors)):
        for data, where in shards:
            held[where] = held.get(where, 0) + data.numel() * data.element_size()
    return held


# ---- SPMD distributed checkpoints (torch_xla.experimental.distributed_checkpoint) ----------------------
def save_sharded(state: dict[str, Any], folder: Any) -> None:
    """Write `state` (sharded XLA tensors among plain values) to `folder` with torch.distributed.checkpoint and
    torch_xla's SPMD save planner: each device's shards are written from the host, never gathered whole."""
    import torch.distributed.checkpoint as dcp
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner

    torch_xla.sync()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)), planner=SPMDSavePlanner(), no_dist=True)


def empty_like_sharded(shape: tuple[int, ...], dtype: torch.dtype, donor: torch.Tensor | None) -> torch.Tensor:
    """A zero tensor to read a checkpoint into: with `donor` (an XLA tensor of the same shape) on its device with
    its sharding, so that each device reads its own shards only; without one, on the host."""
    tensor = torch.zeros(shape, dtype=dtype)
    if donor is None or donor.device.type != "xla" or tuple(donor.shape) != tuple(shape):
        return tensor
    # Made on the host and moved: a tensor computed on the device would lose the sharding at the next sync.
    tensor = tensor.to(donor.device)
    sharding = torch_xla._XLAC._get_xla_op_sharding(donor)
    if sharding is not None:
        torch_xla._XLAC._xla_mark_sharding(tensor, sharding)
    return tensor


def load_sharded(target: dict[str, Any], folder: Any) -> None:
    """Read `folder` (written by `save_sharded`) into `target`'s tensors in place, each device reading its own
    shards (torch_xla's SPMD load planner, through accel's reader: the metadata and every non-tensor item are
    read without unrestricted unpickling).

    Raises:
        accel.errors.CheckpointError: damaged or incomplete shards, or a folder of another model.
        accel.errors.UnsafeCheckpointError: an item would need arbitrary code to load.
    """
    from accel.checkpoint.dcp import load_into
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

    load_into(target, folder, no_dist=True, planner=SPMDLoadPlanner)
    torch_xla.sync()
