"""The CPU stand-in for `accel_xla.xla` under emulation (`ACCEL_EMULATE=1`).

Function for function the same as `accel_xla.xla`: the device is the CPU, the backend gloo,
gradients are averaged across processes with torch.distributed, and there is no graph to
cut. It counts the calls the adapter makes (`calls`), so tests can check where the step
cuts the graph without torch_xla.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from accel.distributed.ops import send_to_device

calls: Counter[str] = Counter()
"""How often each stand-in was called (for tests)."""

COMPILE_BACKEND = "aot_eager"
"""The stand-in for XLA's compiler: torch's backend that traces forward and backward into graphs and runs them
without generating kernels (as XLA traces; `openxla` itself needs torch_xla). The adapter maps `openxla` to it."""
COMPILE_BACKENDS = frozenset({COMPILE_BACKEND})


def register_backend() -> None:
    calls["register_backend"] += 1


def device() -> torch.device:
    return torch.device("cpu")


def device_kind() -> str:
    return "CPU"


def sync() -> None:
    calls["sync"] += 1


def barrier() -> None:
    calls["barrier"] += 1
    dist.barrier()


def all_reduce_mean(tensors: list[torch.Tensor]) -> None:
    """Average `tensors` in place across processes (one flat all-reduce, as XLA fuses them into one)."""
    calls["all_reduce_mean"] += 1
    if not tensors or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def reduce_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Average the optimizer's gradients across processes, as `xm.reduce_gradients` does across replicas."""
    calls["reduce_gradients"] += 1
    all_reduce_mean([p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None])


def broadcast_master_params(model: torch.nn.Module) -> None:
    """Every process takes rank 0's parameters."""
    calls["broadcast_master_params"] += 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for p in model.parameters():
                dist.broadcast(p.data, src=0)


def step_only(optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
    calls["optimizer_step"] += 1
    return optimizer.step(closure) if closure is not None else optimizer.step()


def shard_batches(on: bool) -> None:
    """SPMD's batch sharding: emulation has no SPMD (xla_fsdp_v2 is refused), so nothing to set."""


def device_loader(batches: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """Batches moved to `device` one by one, with the graph cut the real loader makes before each."""
    calls["device_loader"] += 1
    for batch in batches:
        sync()
        yield send_to_device(batch, device)


_seed = [0]
"""The emulated device's RNG state: one integer, as `xm.get_rng_state()` returns."""


def generator(index: int = 0) -> torch.Generator:
    """A generator for the next draw on the emulated device, seeded from the device's integer
    state, which then advances (as XLA derives each execution's seed and moves it on)."""
    gen = torch.Generator().manual_seed(_seed[0])
    _seed[0] = (_seed[0] * 6364136223846793005 + 1442695040888963407) % 2**63
    return gen


def get_rng_state() -> int:
    return _seed[0]


def set_rng_state(state: int) -> None:
    _seed[0] = int(state)


def manual_seed(seed: int) -> None:
    _seed[0] = int(seed)


def counters() -> dict[str, int]:
    return {"compilations": 0, "executions": calls["sync"]}


# torch_xla's SPMD partitioner (the xla_fsdp_v2 strategy) has no stand-in: emulation refuses it.
_NO_SPMD = (
    "The xla_fsdp_v2 strategy needs torch_xla's SPMD partitioner, which emulation does not have: run it on the "
    "xla adapter with torch_xla installed (a TPU VM, or PJRT_DEVICE=CPU), not emulated. Use 'xla_ddp' here."
)


def use_spmd() -> None:
    raise ValueError(_NO_SPMD)


def spmd_mode() -> str:
    return "unavailable"


def global_mesh() -> Any:
    raise ValueError(_NO_SPMD)


def mesh_shape() -> dict[str, int]:
    raise ValueError(_NO_SPMD)


def mark_batch_sharding(tensor: torch.Tensor, mesh: Any) -> None:
    raise ValueError(_NO_SPMD)


def wrap_policies() -> dict[str, Any]:
    raise ValueError(_NO_SPMD)


def sharding_spec(tensor: torch.Tensor) -> str:
    return ""


def local_shard_bytes(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Everything on the one emulated device."""
    return {"CPU:0": sum(t.numel() * t.element_size() for t in tensors)}


def save_sharded(state: dict[str, Any], folder: Any) -> None:
    raise ValueError(_NO_SPMD)


def empty_like_sharded(shape: tuple[int, ...], dtype: torch.dtype, donor: torch.Tensor | None) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


def load_sharded(target: dict[str, Any], folder: Any) -> None:
    raise ValueError(_NO_SPMD)


def fsdp_v2_wrap(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    raise ValueError(_NO_SPMD)


def is_fsdp_v2(model: torch.nn.Module) -> bool:
    return False


# Where the kit runs without torch_xla (`accel_xla.xla` imports it at the top), the public functions
# `accel_xla.xla` has; the kit checks this stand-in's names against them (tests/test_conformance.py checks
# this list against xla.py's source).
REAL_FUNCTIONS = (
    "all_reduce_mean",
    "barrier",
    "broadcast_master_params",
    "counters",
    "device",
    "device_kind",
    "device_loader",
    "empty_like_sharded",
    "fsdp_v2_wrap",
    "get_rng_state",
    "global_mesh",
    "is_fsdp_v2",
    "load_sharded",
    "local_shard_bytes",
    "manual_seed",
    "mark_batch_sharding",
    "mesh_shape",
    "reduce_gradients",
    "register_backend",
    "save_sharded",
    "set_rng_state",
    "shard_batches",
    "sharding_spec",
    "spmd_mode",
    "step_only",
    "sync",
    "use_spmd",
    "wrap_policies",
)
