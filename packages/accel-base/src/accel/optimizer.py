"""Accelerate's `optimizer` module path: the prepared optimizer (`accel.prepare.optimizer`)."""

from .prepare.optimizer import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
