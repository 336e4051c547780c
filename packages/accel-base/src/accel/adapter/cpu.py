"""The built-in adapter: CPUs with the gloo backend. Chosen when nothing better is available."""

from __future__ import annotations

from typing import ClassVar

from .base import Adapter, Availability, Capabilities


class CPUAdapter(Adapter):
    """Any CPU, gloo collectives, bf16/fp16 autocast, torch.compile with inductor."""

    name: ClassVar[str] = "cpu"
    priority: ClassVar[int] = 0
    hardware_device_type: ClassVar[str] = "cpu"
    hardware_backend: ClassVar[str] = "gloo"
    capabilities: ClassVar[Capabilities] = Capabilities(
        precisions=frozenset({"no", "bf16", "fp16"}),
        strategies=frozenset({"ddp", "fsdp2", "deepspeed", "megatron"}),
        compile=True,
        multi_process=True,
        parallelism=frozenset({"tp", "hsdp"}),
    )

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=True, reason="always available")
