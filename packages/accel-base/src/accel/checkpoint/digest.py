"""The integrity hash of checkpoint files, and the text a manifest records it as.

New manifests record BLAKE3 digests as ``"blake3:<64 hex digits>"``: BLAKE3 hashes at
memory speed on several threads, so verifying a file costs about as much as copying it
once. A bare 64-digit digest is SHA-256, which accel recorded before (and which a manifest
may still hold): both verify. The hash is an integrity check, not a signature: the manifest
sits beside the files it describes, so whoever can rewrite a file can rewrite its digest too.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import blake3

_BLAKE3 = "blake3:"
DIGEST_RE = re.compile(r"(?:blake3:)?[0-9a-f]{64}")
"""A digest as a manifest records it: ``blake3:<hex>``, or bare hex for SHA-256."""


class Hasher:
    """Hashes bytes in the algorithm of a recorded digest (BLAKE3 when there is none)."""

    def __init__(self, like: str | None = None) -> None:
        self.sha256 = like is not None and not like.startswith(_BLAKE3)
        self._hash: Any = hashlib.sha256() if self.sha256 else blake3.blake3(max_threads=blake3.blake3.AUTO)

    def update(self, data: Any) -> None:
        """Add `data` (any buffer); the GIL is released while large buffers are hashed."""
        self._hash.update(data)

    def text(self) -> str:
        """The digest as a manifest records it."""
        digest = self._hash.hexdigest()
        return str(digest) if self.sha256 else _BLAKE3 + str(digest)


def name_of(recorded: str | None) -> str:
    """The algorithm of a recorded digest, for messages: "SHA-256" or "BLAKE3 hash"."""
    return "SHA-256" if recorded is not None and not recorded.startswith(_BLAKE3) else "BLAKE3 hash"


def of_bytes(data: Any) -> str:
    """The BLAKE3 digest of `data`, as recorded."""
    hasher = Hasher()
    hasher.update(data)
    return hasher.text()
