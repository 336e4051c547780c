"""Accelerate's `scheduler` module path: the prepared scheduler (`accel.prepare.scheduler`)."""

from .prepare.scheduler import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
