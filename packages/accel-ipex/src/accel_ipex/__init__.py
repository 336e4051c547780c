"""accel-ipex: the intel-extension-for-pytorch adapter for accel (Intel CPUs and XPUs).

Installed, it registers the `ipex` adapter in the `accel.adapter` entry-point group. It is
chosen over the plain cpu adapter when IPEX is installed with the torch it was built for.
"""

from .adapter import IpexAdapter
from .options import IpexOptions
from .versions import IpexVersionError

__version__ = "0.1.0"

__all__ = ["IpexAdapter", "IpexOptions", "IpexVersionError", "__version__"]
