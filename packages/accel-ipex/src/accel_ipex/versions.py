"""IPEX pins one torch minor: check the pair before anything imports IPEX.

IPEX's own check runs inside `import intel_extension_for_pytorch` and, in 2.8.0, ends in
`os.exit(127)` (an AttributeError, after a print), so a mismatch must be caught from the
installed distributions' metadata first. Nothing here imports IPEX.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

from accel.errors import AccelError

DISTRIBUTION = "intel-extension-for-pytorch"
MODULE = "intel_extension_for_pytorch"


class IpexVersionError(AccelError, ImportError):
    """intel-extension-for-pytorch and torch are from different minor releases."""


def minor(version: str) -> str:
    """ "2.8.0+cpu" -> "2.8"; raises ValueError for a string that is no version."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"{version!r} is not a version number")
    return f"{match.group(1)}.{match.group(2)}"


def check_pair(torch_version: str, ipex_version: str) -> None:
    """Raise IpexVersionError unless both versions share a major.minor release.

    The message names both versions and the two ways out.
    """
    if minor(torch_version) != minor(ipex_version):
        raise IpexVersionError(
            f"intel-extension-for-pytorch {ipex_version} works only with torch {minor(ipex_version)}.*, but torch "
            f"{torch_version} is installed. Install the matching torch (pip install 'torch=={minor(ipex_version)}.*') "
            f"or the IPEX release for your torch (pip install 'intel-extension-for-pytorch=={minor(torch_version)}.*')."
        )


def installed_ipex_version() -> str | None:
    """The installed IPEX distribution's version, or None when it is not installed."""
    if importlib.util.find_spec(MODULE) is None:
        return None
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_torch_version() -> str:
    return importlib.metadata.version("torch")


def torch_has_xccl() -> bool:
    """Whether this torch has its own XPU collective backend, `xccl` (torch >= 2.7 built with it), as Accelerate's
    `is_xccl_available` answers."""
    import torch
    import torch.distributed as dist

    if tuple(int(part) for part in minor(torch.__version__).split(".")) < (2, 7) or not dist.is_available():
        return False
    check = getattr(dist.distributed_c10d, "is_xccl_available", None)
    return bool(check is not None and check())
