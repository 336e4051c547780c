"""`realnpu`: an adapter whose device calls all reach its vendor module; `hollownpu`: the same
with every device hook deleted."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities


class RealNPUAdapter(Adapter):
    name: ClassVar[str] = "realnpu"
    hardware_device_type: ClassVar[str] = "npu"
    hardware_backend: ClassVar[str] = "hccl"
    data_parallel_name: ClassVar[str] = "MULTI_NPU"
    capabilities: ClassVar[Capabilities] = Capabilities(
        precisions=frozenset({"no", "fp16"}), strategies=frozenset({"ddp"}), multi_process=True
    )
    vendor_module: ClassVar[str] = "kit_npu.npu"
    emulated_vendor_module: ClassVar[str] = "kit_npu.npu_emulated"
    local_index = 0

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=False, reason="no NPU in the kit's own tests")

    def device_for(self, local_rank: int) -> torch.device:
        self.local_index = local_rank
        return super().device_for(local_rank)

    def set_device(self, device: torch.device) -> None:
        self.vendor.set_device(self.local_index)

    def make_grad_scaler(self, precision: str, **kwargs: Any) -> torch.amp.GradScaler | None:
        return self.vendor.GradScaler(self.device_type, **kwargs) if precision == "fp16" else None


class HollowNPUAdapter(RealNPUAdapter):
    """Every device hook deleted: the vendor module is never reached."""

    name: ClassVar[str] = "hollownpu"

    def set_device(self, device: torch.device) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass

    def get_device_rng_state(self) -> Any:
        return None

    def set_device_rng_state(self, state: Any) -> None:
        pass

    def make_grad_scaler(self, precision: str, **kwargs: Any) -> torch.amp.GradScaler | None:
        return torch.amp.GradScaler(self.device_type, **kwargs) if precision == "fp16" else None


class GatedNPUAdapter(RealNPUAdapter):
    """Decides on hardware only: fused Adam and channels_last, both gated on `emulate` (the anti-pattern)."""

    name: ClassVar[str] = "gatednpu"

    def optimize_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        return model if self.emulate else model.to(memory_format=torch.channels_last)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: Any) -> torch.optim.Optimizer:
        if not self.emulate:
            optimizer.defaults["fused"] = True
        return optimizer

    def decision_record(self, model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
        return {"vendor_layers": 0}
