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


def device_loader(batches: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """torch_xla's parallel device loader over `batches`: a background thread moves upcoming
    batches to `device` while the current step runs, and the loader cuts the graph (`sync`)
    before handing out each batch."""
    return iter(pl.MpDeviceLoader(_Once(batches), device))


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


def fsdp_v2_wrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under torch_xla's SPMD FSDP (FSDPv2, `SpmdFullyShardedDataParallel`).

    Turns SPMD on if it is not yet (see `use_spmd`) and shards each parameter along the "fsdp" axis of the global mesh; when none is set, a mesh of
    every device of the runtime, axes ("fsdp", "model") of shape (devices, 1), becomes the
    global mesh.
    """
    import numpy as np
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    xr.use_spmd()
    mesh = xs.get_global_mesh()
    if mesh is None:
        count = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(count), (count, 1), ("fsdp", "model"))
        xs.set_global_mesh(mesh)
    return SpmdFullyShardedDataParallel(model, mesh=mesh)


def is_fsdp_v2(model: torch.nn.Module) -> bool:
    """Whether `model` is torch_xla's SPMD FSDP wrapper."""
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    return isinstance(model, SpmdFullyShardedDataParallel)
