"""Accelerate's `scheduler` module path: the prepared scheduler (`accel.prepare.wrappers`)."""

from .prepare.wrappers import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
