"""The XLA adapter's launch flags: `accel launch --adapter xla --pjrt-device TPU` sets what
torch_xla reads in the workers (`PJRT_DEVICE`, `CPU_NUM_DEVICES`). The flags and variables come
from `accel.adapter_options`; the adapter itself parses nothing (torch_xla reads the variables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accel.adapter_options import AdapterOptions, AdapterOptionsError, option

PJRT_DEVICES = ("TPU", "CPU", "CUDA")


@dataclass(kw_only=True, frozen=True)
class XLALaunchOptions(AdapterOptions):
    """What `accel launch` sets up for torch_xla in the workers."""

    label: ClassVar[str] = "XLA"

    pjrt_device: str | None = option(
        None,
        env="PJRT_DEVICE",
        flag="--pjrt-device",
        choices=PJRT_DEVICES,
        help="xla: the PJRT device the workers use (PJRT_DEVICE): TPU on a TPU VM, CPU for torch_xla's CPU device",
    )
    """The PJRT device (None: torch_xla's own choice)."""
    xla_cpu_devices: int | None = option(
        None,
        env="CPU_NUM_DEVICES",
        flag="--xla-cpu-devices",
        minimum=1,
        help="xla: with --pjrt-device CPU, how many CPU devices each worker's runtime creates (CPU_NUM_DEVICES)",
    )
    """With `pjrt_device="CPU"`: how many CPU devices each worker's runtime creates."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.xla_cpu_devices is not None and self.pjrt_device != "CPU":
            raise AdapterOptionsError(
                f"--xla-cpu-devices {self.xla_cpu_devices} needs --pjrt-device CPU; "
                "on a TPU the runtime finds its chips itself."
            )
