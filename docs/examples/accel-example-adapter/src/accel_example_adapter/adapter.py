"""The adapter for the "example" device: a CPU that needs a step marker after optimizer steps."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from accel.adapter import Adapter, Availability, Capabilities
from accel.adapter.options import AdapterOptions, option
from accel.prepare import RunContext


@dataclass(kw_only=True, frozen=True)
class ExampleOptions(AdapterOptions):
    """The example adapter's options: `Accelerator(adapter_options=...)`, `accel launch` flags or variables."""

    label: ClassVar[str] = "example"

    mark_every: int = option(
        1,
        env="ACCEL_EXAMPLE_MARK_EVERY",
        flag="--example-mark-every",
        minimum=1,
        help="example: optimizer steps between two step markers",
    )
    """Tell the device a step is done after every this many optimizer steps."""


class ExampleAdapter(Adapter):
    api_version: ClassVar[int] = 3  # the adapter contract it was written for (accel.adapter.ADAPTER_API_VERSION)
    name: ClassVar[str] = "example"
    priority: ClassVar[int] = 10
    hardware_device_type: ClassVar[str] = "cpu"
    hardware_backend: ClassVar[str] = "gloo"
    capabilities: ClassVar[Capabilities] = Capabilities(
        precisions=frozenset({"no", "bf16"}),
        strategies=frozenset({"ddp"}),
        compile=False,
        multi_process=True,
    )
    vendor_module: ClassVar[str] = "accel_example_adapter.device"
    emulated_vendor_module: ClassVar[str] = "accel_example_adapter.device_emulated"
    options_class: ClassVar[type[ExampleOptions]] = ExampleOptions
    config: ExampleOptions
    optimizer_steps = 0
    local_index = 0

    @classmethod
    def availability(cls) -> Availability:
        # Cheap and never raises: `accel env` calls it for every installed adapter.
        if os.environ.get("EXAMPLE_DEVICE") == "1":
            return Availability(available=True)
        return Availability(available=False, reason="no example device (EXAMPLE_DEVICE is not 1)")

    def device_for(self, local_rank: int) -> torch.device:
        self.local_index = local_rank
        return super().device_for(local_rank)  # the device computes on the host's memory

    def set_device(self, device: torch.device) -> None:
        # Before the process group: this rank's device is current, so its generator is the one
        # device code draws from. Device RNG needs no more code: the base manual_seed,
        # get_device_rng_state and set_device_rng_state call the vendor module's manual_seed,
        # get_rng_state and set_rng_state, so set_seed, save_state and load_state reach them.
        self.vendor.set_device(self.local_index)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: RunContext) -> torch.optim.Optimizer:
        # A vendor decision: AdamW runs the device's fused kernel when it has one. Never gate
        # it on `self.emulate`: the kit's decision record (fused flag) would differ.
        if isinstance(optimizer, torch.optim.AdamW) and self.vendor.has_fused_adamw():
            for group in optimizer.param_groups:
                group.update(fused=True, foreach=False)
            optimizer.defaults.update(fused=True, foreach=False)
        return optimizer

    def decision_record(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
        """What the kit compares between emulation and the hardware twin, beyond dtypes and flags."""
        return {"mark_every": self.config.mark_every}

    def after_optimizer_step(self) -> None:
        self.optimizer_steps += 1
        if self.optimizer_steps % self.config.mark_every == 0:
            self.vendor.mark_step()
