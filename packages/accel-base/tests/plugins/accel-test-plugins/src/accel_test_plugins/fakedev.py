"""A high-priority adapter for a pretend device "fakedev".

It is available only when `ACCEL_TEST_FAKEDEV=1` (so installing it does not change which
adapter the other tests get). Its vendor calls live in `fakedev_vendor`; emulation swaps
in `fakedev_emulated`, which counts calls so tests can see where they happen.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities


class FakeDeviceAdapter(Adapter):
    name: ClassVar[str] = "fakedev"
    priority: ClassVar[int] = 50
    hardware_device_type: ClassVar[str] = "fakedev"
    hardware_backend: ClassVar[str] = "fakeccl"
    capabilities: ClassVar[Capabilities] = Capabilities(
        precisions=frozenset({"no", "bf16"}), strategies=frozenset({"ddp"})
    )
    data_parallel_name: ClassVar[str] = "MULTI_FAKEDEV"
    vendor_module: ClassVar[str] = "accel_test_plugins.fakedev_vendor"
    emulated_vendor_module: ClassVar[str] = "accel_test_plugins.fakedev_emulated"

    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        return {"is_fakedev_available": lambda: bool(cls.availability())}

    @classmethod
    def availability(cls) -> Availability:
        if os.environ.get("ACCEL_TEST_FAKEDEV") == "1":
            return Availability(available=True)
        return Availability(available=False, reason="no fakedev device (set ACCEL_TEST_FAKEDEV=1)")

    def after_backward(self) -> None:
        self.vendor.mark_step()

    def after_optimizer_step(self) -> None:
        self.vendor.mark_step()

    def optimize_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        model._fakedev_prepared = True  # the decision under test: made the same way emulated or not
        return model

    @classmethod
    def add_launch_arguments(cls, parser: Any) -> None:
        parser.add_argument("--fakedev-lazy", action="store_true", help="fakedev: lazy mode")

    @classmethod
    def launch_env(cls, args: Any) -> dict[str, str]:
        return {"FAKEDEV_LAZY": "1"} if getattr(args, "fakedev_lazy", False) else {}
