"""The one place where megatron-core's CUDA-only lookups are pointed at the CPU.

megatron-core assumes CUDA in a handful of places that have nothing to do with the
parallel algorithms: it asks `torch.cuda.current_device()` (or writes `device="cuda"`)
for its gradient buffers, optimizer scalars, gradient-norm tensors and pipeline
messages, and keeps its model-parallel RNG streams in CUDA generators. On a CUDA device
none of this module is used. When the prepared device is not CUDA (the CPU adapter, or
any adapter under `--emulate`), exactly these lookups are redirected and nothing else
changes: the process groups, sharding, collectives and arithmetic are megatron-core's own.

- `redirected()`: while megatron-core builds its DDP buffers, steps its optimizer, runs
  its pipeline schedule or checkpoints, "cuda" devices and `torch.cuda.current_device()`
  resolve to the CPU, `torch.cuda.synchronize()` returns at once (CPU work is already done), `Tensor.cuda()` is a no-op and `Tensor.type()` names the CUDA type
  (the distributed optimizer accepts parameters by that name).
- `cpu_rng_tracker_class()` / `model_parallel_manual_seed`: the model-parallel RNG tracker
  (`fork()` runs in every forward of a tensor-parallel layer) on the CPU generator.
- `GlobalMemoryBuffer.get_tensor`: the scratch buffer of sequence-parallel all-gathers.
- activation recomputation's save/restore of the CUDA generator's state: nothing to do (the CPU
  generator's state and the tracker's streams are saved and restored by megatron-core itself).
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterator
from functools import reduce
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_ACTIVE = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    """Creates on the CPU what megatron-core asks to create on "cuda"."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # The distributed optimizer accepts parameters by their CUDA type name only.
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def redirected() -> Iterator[None]:
    """Run megatron-core code with its CUDA device lookups resolved to the CPU."""
    global _ACTIVE
    if _ACTIVE:
        yield
        return
    # CPU work is done when the call returns, so "wait for the device" has nothing to wait for.
    lookups: dict[str, Any] = {"current_device": lambda: torch.device("cpu"), "synchronize": lambda *a, **k: None}
    saved = {name: getattr(torch.cuda, name) for name in lookups}
    for name, value in lookups.items():
        setattr(torch.cuda, name, value)
    _ACTIVE = True
    try:
        with _CudaToCpu():
            yield
    finally:
        for name, value in saved.items():
            setattr(torch.cuda, name, value)
        _ACTIVE = False


@functools.cache
def cpu_rng_tracker_class() -> type:
    """`CpuRNGStatesTracker`: megatron-core's named RNG streams, kept as states of the CPU generator.

    Built on first use so that importing accel_megatron does not import megatron-core.
    """
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class CpuRNGStatesTracker(CudaRNGStatesTracker):  # type: ignore[misc]
        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise ValueError(f"RNG seed {seed} is already tracked.")
            if name in self.states_:
                raise ValueError(f"RNG state {name!r} already exists.")
            self._is_initialized = True
            self.seeds_.add(seed)
            saved = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            if name not in self.states_:
                raise ValueError(f"RNG state {name!r} was never added; call model_parallel_manual_seed first.")
            saved = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(saved)

    return CpuRNGStatesTracker


def model_parallel_manual_seed(seed: int) -> None:
    """`model_parallel_cuda_manual_seed` on the CPU generator: the same named streams and seeds."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    random.initialize_rng_tracker(force_reset=True)
    tracker = cpu_rng_tracker_class()()
    random._CUDA_RNG_STATE_TRACKER = tracker
    random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # The seed layout of model_parallel_cuda_manual_seed: data-parallel regions share `seed`,
    # tensor-parallel regions differ per TP rank, expert regions per EP/ETP rank.
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker.add(random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank)


def _cpu_get_tensor(self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None) -> Any:
    required = reduce(operator.mul, tensor_shape, 1)
    buffer = self.buffer.get((name, dtype))
    if buffer is None or buffer.numel() < required:
        buffer = self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu")
    return buffer[:required].view(*tensor_shape)


def install(seed: int) -> None:
    """Point megatron-core's persistent CUDA lookups (RNG tracker, scratch buffer) at the CPU.

    Call after `initialize_model_parallel`; idempotent.
    """
    from megatron.core.tensor_parallel import random
    from megatron.core.utils import GlobalMemoryBuffer

    GlobalMemoryBuffer.get_tensor = _cpu_get_tensor  # type: ignore[method-assign]
    # Activation recomputation saves and restores "the CUDA generator" next to the CPU one and the
    # tracker's streams; here the CPU generator is the only one, and it is saved already.
    random._get_cuda_rng_state = lambda *args, **kwargs: None
    random._set_cuda_rng_state = lambda *args, **kwargs: None
    model_parallel_manual_seed(seed)


def redirect_moe_layers(model: torch.nn.Module) -> bool:
    """megatron-core's MoE layers ask for the CUDA device in their forward (the router moves its weight
    there; the token dispatcher's all-gathers allocate there): each MoE layer's forward runs redirected
    (their backward too: see `MegatronStrategy.backward`). Returns whether the model has MoE layers."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.moe_layer import MoELayer

    # megatron-core 0.16.1's router gate names Transformer Engine's GEMM without defining it when TE is
    # absent (NameError); None selects its own torch matmul path.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    for module in model.modules():
        if isinstance(module, MoELayer) and not getattr(module, "_accel_redirected", False):
            forward = module.forward

            @functools.wraps(forward)
            def run(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
                with redirected():
                    return _forward(*args, **kwargs)

            module.forward = run  # type: ignore[method-assign]
            module._accel_redirected = True
    return any(isinstance(module, MoELayer) for module in model.modules())
