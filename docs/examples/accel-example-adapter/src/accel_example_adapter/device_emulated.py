"""The CPU stand-in for `device`: same functions, no hardware."""

from __future__ import annotations

steps = 0


def mark_step() -> None:
    global steps
    steps += 1


def has_fused_adamw() -> bool:
    return True  # as the device says: the decision it drives is made under emulation too
