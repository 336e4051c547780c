"""accel-gaudi: the Intel Gaudi (HPU) adapter for accel.

Installed, it registers the `gaudi` adapter in the `accel.adapter` entry-point group.
Without Habana's software stack it runs emulated on the CPU (`ACCEL_EMULATE=1`).
"""

from .adapter import GaudiAdapter
from .fp8 import GaudiFP8RecipeKwargs
from .options import GaudiOptions

__version__ = "0.1.0"

__all__ = ["GaudiAdapter", "GaudiFP8RecipeKwargs", "GaudiOptions", "__version__"]
