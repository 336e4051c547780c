"""`CUDAAdapter`: NVIDIA GPUs under accel, one `cuda:<local_rank>` per process, NCCL between them.

Every CUDA call goes through `self.vendor` (`accel_cuda.cuda`, or `accel_cuda.cuda_emulated`
under emulation); the decisions here are the same either way.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities
from accel.data.loader import DataLoaderShard
from accel.errors import DistributedSetupError

from .options import CUDAOptions, TF32Kwargs
from .precision import CUDAPrecision

if TYPE_CHECKING:
    from accel.prepare.context import RunContext


P2P_IB_MESSAGE = (
    "Using RTX 4000 series doesn't support faster communication broadband via P2P or IB. "
    'Please set `NCCL_P2P_DISABLE="1"` and `NCCL_IB_DISABLE="1"` or use `accel launch` which will do this '
    "automatically."
)
"""Accelerate's message (its state.py) for a multi-GPU run on RTX 4000-series cards without the two variables."""
P2P_IB_VARIABLES = ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")


class P2PUnsupportedError(DistributedSetupError, NotImplementedError):
    """Several RTX 4000-series GPUs on a driver older than 550.40.07, without `NCCL_P2P_DISABLE` and
    `NCCL_IB_DISABLE` set: NCCL would hang or corrupt data over P2P/IB. A `NotImplementedError`, as in
    Accelerate."""


def lacks_p2p_ib(vendor: ModuleType) -> bool:
    """Accelerate's test (`check_cuda_p2p_ib_support`, inverted): the machine has several GPUs, RTX 4000-series
    among them, on a driver before 550.40.07 (from which NCCL's P2P/IB work on them). False when unknown."""
    names, driver = vendor.machine_gpus()
    parts = re.findall(r"\d+", driver)
    if len(names) < 2 or not parts or not any("RTX 40" in name for name in names):
        return False
    return tuple(int(p) for p in parts) < (550, 40, 7)


class CUDAAdapter(Adapter):
    """NVIDIA GPUs with the nccl backend: DDP (comm hooks included) or FSDP2, torch.compile with
    inductor, bf16 and fp16 autocast, fp8 through TransformerEngine or torchao."""

    name: ClassVar[str] = "cuda"
    # Above every other adapter: a machine with a CUDA device runs on it unless told otherwise.
    priority: ClassVar[int] = 100
    hardware_device_type: ClassVar[str] = "cuda"
    hardware_backend: ClassVar[str] = "nccl"
    data_parallel_name: ClassVar[str] = "MULTI_GPU"
    visible_devices_env: ClassVar[str | None] = "CUDA_VISIBLE_DEVICES"
    precision_class = CUDAPrecision
    capabilities: ClassVar[Capabilities] = Capabilities(
        precisions=frozenset({"no", "bf16", "fp16", "fp8"}),
        strategies=frozenset({"ddp", "fsdp2", "deepspeed", "megatron"}),
        compile=True,
        multi_process=True,
        parallelism=frozenset({"tp", "hsdp", "cp"}),
    )
    vendor_module: ClassVar[str] = "accel_cuda.cuda"
    emulated_vendor_module: ClassVar[str] = "accel_cuda.cuda_emulated"
    options_class: ClassVar[type[CUDAOptions]] = CUDAOptions
    config: CUDAOptions
    """Data-loader options (`ACCEL_CUDA_*`, then `Accelerator(adapter_options=...)`)."""

    def __init__(self, *, emulate: bool = False, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self.local_index: int | None = None
        """The GPU index this process uses (set by `device_for`)."""

    # ---- discovery and device -----------------------------------------------------------
    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        """`accel.utils.is_cuda_available`: a usable CUDA GPU is present."""
        return {"is_cuda_available": lambda: bool(cls.availability())}

    @classmethod
    def availability(cls) -> Availability:
        try:
            from . import cuda
        except Exception as exc:  # never fatal: an unusable stack is "not available", with the reason
            return Availability(available=False, reason=f"importing torch.cuda failed: {exc}")
        if not cuda.is_available():
            build = torch.version.cuda
            why = "torch is a CPU-only build" if build is None else f"torch (CUDA {build}) sees no GPU"
            return Availability(available=False, reason=why)
        count = cuda.device_count()
        return Availability(available=True, reason=f"{count} GPU(s): {cuda.device_name(0)}")

    def device_for(self, local_rank: int) -> torch.device:
        """`cuda:<local_rank>` among the visible GPUs (CUDA_VISIBLE_DEVICES renumbers them from 0).

        Raises:
            ValueError: more local processes than visible GPUs (NCCL cannot share one GPU
                between two ranks).
        """
        count = self.vendor.device_count()
        if local_rank >= count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
            raise ValueError(
                f"Local rank {local_rank} needs GPU {local_rank}, but this process sees {count} GPU(s){seen}. "
                f"Launch at most {count} process(es) per node, or make more GPUs visible."
            )
        self.local_index = local_rank
        return torch.device("cpu") if self.emulate else torch.device("cuda", local_rank)

    def set_device(self, device: torch.device) -> None:
        # Before the process group: NCCL binds its communicator to the current device, and
        # without this every rank would create a context on GPU 0.
        if self.local_index is not None:
            self.vendor.set_device(self.local_index)

    def before_process_group(self, device: torch.device) -> None:
        # Before NCCL starts, where Accelerate checks after: a hang over P2P/IB is worse than an error.
        if lacks_p2p_ib(self.vendor) and any(var not in os.environ for var in P2P_IB_VARIABLES):
            raise P2PUnsupportedError(P2P_IB_MESSAGE)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        """The data-loader flags' variables, and `NCCL_P2P_DISABLE=1` / `NCCL_IB_DISABLE=1` on a machine whose
        RTX 4000-series GPUs cannot use P2P/IB (each unless already set), with Accelerate's warning."""
        env = super().launch_env(args)
        vendor = importlib.import_module(
            cls.emulated_vendor_module if getattr(args, "emulate", False) else cls.vendor_module
        )
        missing = [var for var in P2P_IB_VARIABLES if var not in os.environ]
        if missing and lacks_p2p_ib(vendor):
            env.update(dict.fromkeys(missing, "1"))
            print(
                "accel launch: Using RTX 4000 series which doesn't support faster communication speedups. "
                "Ensuring P2P and IB communications are disabled.",
                file=sys.stderr,
            )
        return env

    # ---- precision ----------------------------------------------------------------------
    def supports_precision(self, precision: str) -> bool:
        if precision == "bf16" and not self.vendor.is_bf16_supported():
            return False  # pre-Ampere GPUs: bf16 would be emulated, slower than fp32
        return super().supports_precision(precision)

    def precision_fallback(self, precision: str) -> tuple[str, str] | None:
        """fp8 on a GPU without fp8 tensor cores (compute capability below 8.9): fp16, with Accelerate's
        warning, as Accelerate does."""
        if precision != "fp8":
            return None
        ok, device = self.vendor.fp8_hardware_supported()
        if ok:
            return None
        return "fp16", (
            f"The current device ({device}) has a compute capability insufficient for FP8 mixed precision "
            "training (requires a GPU Hopper/Ada Lovelace or higher, compute capability of 8.9 or higher). "
            "Will use FP16 instead."
        )

    # ---- prepare --------------------------------------------------------------------------
    def before_prepare(self, objects: list[Any], ctx: RunContext) -> None:
        tf32 = ctx.handler(TF32Kwargs)
        if tf32 is not None:
            self.vendor.set_tf32(tf32.matmul, tf32.cudnn)
        elif ctx.mixed_precision == "no" and self._compiles(ctx):
            # Accelerate turns TF32 matmuls on for every compiled fp32 run on a GPU (its state.py): the
            # same script gets the same kernels here. A `TF32Kwargs` handler is the user's choice and wins.
            self.vendor.set_tf32(True, None)

    def _compiles(self, ctx: RunContext) -> bool:
        settings = self.dynamo_settings(ctx.dynamo_plugin)
        return settings is not None and settings.backend not in (None, "no")

    def compile_backend(self) -> str:
        return self.vendor.COMPILE_BACKEND  # type: ignore[no-any-return]

    def pins_memory(self) -> bool:
        """Whether prepared data loaders pin their batches (option on, and the runtime can)."""
        return self.config.pin_memory and bool(self.vendor.can_pin_memory())

    def prepare_data_loader_kwargs(self, ctx: RunContext) -> dict[str, Any]:
        return {"pin_memory": True} if ctx.device_placement and self.pins_memory() else {}

    def after_prepare(self, prepared: list[Any], ctx: RunContext) -> None:
        # The core's loader copies with the user's `non_blocking`; pinned batches make an
        # asynchronous copy safe, so turn it on for the loaders this adapter pinned.
        if not self.config.non_blocking:
            return
        for obj in prepared:
            if isinstance(obj, DataLoaderShard) and obj.pin_memory and obj.device is not None:
                obj.non_blocking = True

    def context_parallel_kernels(self) -> Any:
        """For `maybe_context_parallel`: on a GPU nothing (torch's ring dispatches CUDA's attention kernels);
        emulated, the host's flash kernel registered in torch's ring for the block."""
        return self.vendor.context_parallel_kernels()

    def describe(self) -> str:
        return f"{super().describe()} pin_memory={self.pins_memory()} non_blocking={self.config.non_blocking}"
