"""How a model is spread over processes. Strategies are found through the entry-point
group `accel.strategies`; DDP ships in the core."""

from .base import Strategy

__all__ = ["Strategy"]
