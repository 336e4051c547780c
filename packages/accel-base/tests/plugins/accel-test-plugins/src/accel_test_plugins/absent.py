"""An adapter whose hardware is never present, and an entry point that is not an adapter."""

from __future__ import annotations

from typing import ClassVar

from accel.adapter.base import Adapter, Availability


class AbsentAdapter(Adapter):
    name: ClassVar[str] = "absent"
    priority: ClassVar[int] = 100
    hardware_device_type: ClassVar[str] = "absentdev"

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=False, reason="no absentdev driver found")


class NotAnAdapter:
    pass
