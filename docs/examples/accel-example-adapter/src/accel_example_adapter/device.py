"""Every call into the example device's vendor library, and nothing else."""

from __future__ import annotations

import os

steps = 0


def mark_step() -> None:
    """Tell the device one optimizer step is done (a real vendor library would flush its queue here)."""
    global steps
    if os.environ.get("EXAMPLE_DEVICE") != "1":
        raise RuntimeError("the example device is not present")
    steps += 1


def has_fused_adamw() -> bool:
    """Whether the device's library has a fused AdamW kernel (the adapter then asks for it)."""
    return os.environ.get("EXAMPLE_DEVICE") == "1"
