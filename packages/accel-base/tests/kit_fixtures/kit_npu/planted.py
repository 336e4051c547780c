"""Vendor-style adapters for the kit's own tests: contract versions 1 and 2 written from the docs (they must
pass), and `realnpu` with one realistic bug planted each (the kit must fail each, naming the bug)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities

from kit_npu.adapter import RealNPUAdapter


class VersionOneNPUAdapter(Adapter):
    """Written against contract 1: no api_version-2 members, a stand-in without `generator`."""

    name: ClassVar[str] = "npuv1"
    api_version: ClassVar[int] = 1
    hardware_device_type: ClassVar[str] = "npu"
    hardware_backend: ClassVar[str] = "hccl"
    capabilities: ClassVar[Capabilities] = Capabilities(precisions=frozenset({"no", "bf16"}), multi_process=True)
    vendor_module: ClassVar[str] = "kit_npu.npu_missing"
    emulated_vendor_module: ClassVar[str] = "kit_npu.npu_v1"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=False, reason="no NPU in the kit's own tests")

    def set_device(self, device: torch.device) -> None:
        self.vendor.set_device(int(os.environ.get("LOCAL_RANK", "0")))


class VersionTwoNPUAdapter(VersionOneNPUAdapter):
    name: ClassVar[str] = "npuv2"
    api_version: ClassVar[int] = 2
    data_parallel_name: ClassVar[str] = "MULTI_NPU"


class WrongTypeNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_distributed_type"
    data_parallel_name: ClassVar[str] = "MULTI_GPU"


class OtherCacheNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_empty_cache"

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()  # another device's module: a no-op here, and on the NPU


class SwapAfterPrepareNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_after_prepare"

    def after_prepare(self, prepared: list[Any], ctx: Any) -> None:
        for obj in prepared:
            if hasattr(obj, "optimizer") and isinstance(obj.optimizer, torch.optim.AdamW):
                old = obj.optimizer  # the vendor's fused AdamW, built anew: the scheduler still holds `old`
                d = old.defaults
                params = [p for g in old.param_groups for p in g["params"]]
                obj.optimizer = torch.optim.AdamW(params, lr=d["lr"], weight_decay=d["weight_decay"], betas=d["betas"])


class CoupledDecayNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_coupled_decay"

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: Any) -> torch.optim.Optimizer:
        if isinstance(optimizer, torch.optim.AdamW):  # "fused Adam" with L2 (coupled) weight decay
            d = optimizer.defaults
            params = [p for g in optimizer.param_groups for p in g["params"]]
            return torch.optim.Adam(params, lr=d["lr"], betas=d["betas"], eps=d["eps"], weight_decay=d["weight_decay"])
        return optimizer


class HostModelNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_host_model"

    def places_model(self, ctx: Any) -> bool:
        return False


class WrongBackendNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_backend"

    @property
    def backend(self) -> str:
        return "gloo" if self.emulate else "nccl"


class WrongAutocastNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_autocast"
    capabilities: ClassVar[Capabilities] = Capabilities(precisions=frozenset({"no", "bf16"}), multi_process=True)

    def autocast(self, precision: str, *, enabled: bool = True, cache_enabled: bool | None = None) -> Any:
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled and precision == "bf16")


class MisnamedNPU(RealNPUAdapter):
    name: ClassVar[str] = "bug_stand_in_names"
    vendor_module: ClassVar[str] = "kit_npu.npu_renamed"


class WrongCountNPU(RealNPUAdapter):
    """Reads the device count from the wrong variable: rank 1 fails before the process group forms."""

    name: ClassVar[str] = "bug_device_count"

    def device_for(self, local_rank: int) -> torch.device:
        if local_rank >= len(os.environ.get("NPU_VISIBLE_DEVICES", "0").split(",")):
            raise ValueError(f"NPU {local_rank} is not visible (NPU_VISIBLE_DEVICES)")
        return super().device_for(local_rank)
