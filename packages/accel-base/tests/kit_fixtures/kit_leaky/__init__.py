"""`leakynpu`: the fixture NPU adapter without a `set_device` whose other code still reaches the
vendor module before the process group (it asks it for the device count). A call into the
stand-in is not a device made current: the kit must fail it, naming the setter."""

from __future__ import annotations

from typing import ClassVar

import torch
from kit_npu.adapter import RealNPUAdapter


class LeakyNPUAdapter(RealNPUAdapter):
    name: ClassVar[str] = "leakynpu"

    def device_for(self, local_rank: int) -> torch.device:
        if local_rank >= self.vendor.device_count():
            raise ValueError(f"no NPU {local_rank}")
        return super().device_for(local_rank)

    def set_device(self, device: torch.device) -> None:
        pass
