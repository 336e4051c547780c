"""Accelerate's `optimizer` module path: the prepared optimizer (`accel.prepare.wrappers`)."""

from .prepare.wrappers import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
