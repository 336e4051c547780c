"""Mixed precision: the run's `Precision` (`base`) and fp8 emulated on any device (`fp8_emulation`)."""

from .base import PRECISION_MODES, Precision

__all__ = ["PRECISION_MODES", "Precision"]
