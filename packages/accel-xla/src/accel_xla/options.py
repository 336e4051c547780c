"""The XLA adapter's launch flags: `accel launch --adapter xla --pjrt-device TPU` sets what
torch_xla reads in the workers (`PJRT_DEVICE`, `CPU_NUM_DEVICES`). The flags and variables come
from `accel.adapter.options`; the adapter itself parses nothing (torch_xla reads the variables).
Accelerate's TPU flags (`--tpu`, `--tpu_cluster`, ...) are declared by `add_accelerate_tpu_flags`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

from accel.adapter.options import AdapterOptions, AdapterOptionsError, option

PJRT_DEVICES = ("TPU", "CPU", "CUDA")
DOWNCAST_ENV = "ACCEL_XLA_DOWNCAST_BF16"
"""The workers' variable for Accelerate's `downcast_bf16` (`ACCELERATE_DOWNCAST_BF16` is mapped onto it)."""


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
    downcast_bf16: bool = option(
        False,
        env=DOWNCAST_ENV,
        flag="--downcast-bf16",
        help="xla: with bf16, store float32 tensors in bf16 on the device (torch_xla's XLA_DOWNCAST_BF16) "
        "instead of autocasting; Accelerate's --downcast_bf16",
    )
    """Accelerate's `downcast_bf16`: under `mixed_precision="bf16"` torch_xla keeps float32 tensors in bf16
    (`XLA_DOWNCAST_BF16`) and the forward runs without autocast, on any XLA device."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.xla_cpu_devices is not None and self.pjrt_device != "CPU":
            raise AdapterOptionsError(
                f"--xla-cpu-devices {self.xla_cpu_devices} needs --pjrt-device CPU; "
                "on a TPU the runtime finds its chips itself."
            )


# ---- Accelerate's TPU launch flags ---------------------------------------------------------------
# `accelerate launch --tpu ...` command lines keep working: `--tpu` selects this adapter, the pod
# launcher's switches are refused (or, when they ask for nothing, accepted). Accelerate's `--vm` and
# `--env` are refused by accel itself (not declared here: a flag the core has would leave this
# adapter's whole group out of the parser).
PODS = (
    "Accelerate's TPU pod launcher (it ssh'es into every host) has no counterpart: run `accel launch --adapter xla "
    "--nnodes N --node-rank R --master-addr HOST0 ...` on each host of the pod, e.g. through "
    "`gcloud compute tpus tpu-vm ssh --worker=all` (accel-xla README, 'TPU hosts and pods')"
)
SUDO_IGNORED = (
    "accel launch: {option} is ignored: it only tells Accelerate's pod launcher to run the script with sudo "
    "on each host; `accel launch` runs the script on this host, as you started it"
)


class _SelectXLA(argparse.Action):
    """`--tpu`: run on the xla adapter (as `--adapter xla`); no effect when it is already selected."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        if getattr(namespace, "cpu", False):
            parser.error(f"{option} and --cpu ask for different hardware; give one of them")
        if getattr(namespace, "adapter", None) is None:
            namespace.adapter = "xla"  # another adapter named on the command line is refused later, naming --tpu
        setattr(namespace, self.dest, True)


class _RefusePods(argparse.Action):
    """`--tpu-cluster`: Accelerate's pod launcher, which accel does not have."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        parser.error(f"{option} (an `accelerate launch` flag) is not supported by accel launch: {PODS}")


class _IgnoreSudo(argparse.Action):
    """`--tpu-use-sudo`: only the pod launcher used it; accepted with one note."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        if not getattr(namespace, self.dest, False):
            print(SUDO_IGNORED.format(option=option), file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_accelerate_tpu_flags(group: argparse._ArgumentGroup) -> None:
    """Accelerate's TPU flags (`accelerate launch --tpu`, `--tpu_cluster`, ...), under both spellings.

    - `--tpu` selects the xla adapter (as `--adapter xla`); with it already selected it changes nothing.
    - `--tpu_cluster` is refused (Accelerate's pod launcher): run `accel launch` on each host instead.
    - `--no_tpu_cluster` (Accelerate's default) and `--tpu_use_sudo` (read by the pod launcher only) are
      accepted and change nothing; the latter says so in one note.
    """
    group.add_argument("--tpu", action=_SelectXLA, nargs=0, default=False, help="Accelerate's --tpu: --adapter xla")
    # Accelerate's spelling of --downcast-bf16 (`XLALaunchOptions.downcast_bf16` declares the hyphenated one).
    group.add_argument("--downcast_bf16", dest="downcast_bf16", action="store_const", const=True, default=None,
                       help=argparse.SUPPRESS)  # fmt: skip
    group.add_argument(
        "--tpu-cluster",
        "--tpu_cluster",
        action=_RefusePods,
        nargs=0,
        dest="tpu_use_cluster",
        default=None,
        help="refused: Accelerate's TPU pod launcher; run `accel launch` on each host of the pod",
    )
    group.add_argument(
        "--no-tpu-cluster",
        "--no_tpu_cluster",
        action="store_const",
        const=False,
        dest="tpu_use_cluster",
        default=None,
        help="accepted, no effect: one host is what `accel launch` runs",
    )
    group.add_argument(
        "--tpu-use-sudo",
        "--tpu_use_sudo",
        action=_IgnoreSudo,
        nargs=0,
        default=False,
        help="accepted, no effect (a note says so): only Accelerate's pod launcher ran the script with sudo",
    )
