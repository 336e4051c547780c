"""The IPEX adapter's options: one typed dataclass, filled once from code, flags or environment.

`accel launch --ipex-weights-prepack off --ipex-level O1 --no-ipex-optimize` turns into the
`ACCEL_IPEX_*` variables below (`accel.adapter.options` generates the flags and parses the
variables); the adapter reads them in its `__init__` and nothing deeper reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accel.adapter.options import AdapterOptions, option

LEVELS = ("O0", "O1")


@dataclass(kw_only=True, frozen=True)
class IpexOptions(AdapterOptions):
    """How the IPEX adapter prepares models. Each field has a launch flag and an `ACCEL_IPEX_*` variable."""

    label: ClassVar[str] = "IPEX"

    optimize: bool = option(
        True,
        env="ACCEL_IPEX_OPTIMIZE",
        flag="--ipex-optimize",
        help="ipex: run ipex.optimize on prepared models (--no-ipex-optimize: do not)",
    )
    """Run `ipex.optimize` on prepared models (before any DDP wrap). Off: plain PyTorch on the
    device, with the adapter's device, backend and precision rules."""
    weights_prepack: bool | None = option(
        None,
        env="ACCEL_IPEX_WEIGHTS_PREPACK",
        flag="--ipex-weights-prepack",
        help="ipex: prepack weights into oneDNN layouts ('auto' decides from the CPU's instruction sets)",
    )
    """Prepack Linear/Conv weights into oneDNN's blocked layout (faster kernels, same results).
    None ("auto"): decided per CPU (fp32 always; bf16 only with avx_ne_convert or avx512bw/vl/dq,
    where IPEX would otherwise assert). True on a CPU that cannot prepack bf16 fails in `prepare`."""
    level: str = option(
        "O1", env="ACCEL_IPEX_LEVEL", flag="--ipex-level", choices=LEVELS, help="ipex: ipex.optimize level (O1 default)"
    )
    """`ipex.optimize` level: "O1" (fusions, prepacking, fused optimizer steps) or "O0" (only the
    dtype conversion)."""
