"""The integrity hash of checkpoint files, and the text a manifest records it as.

New manifests record XXH3-128 digests as ``"xxh3-128:<32 hex digits>"``: XXH3 hashes at many
times memory speed on one core, so verifying a file costs a small part of reading it. Digests
recorded before still verify, each in its own algorithm: ``"blake3:<64 hex digits>"`` (BLAKE3)
and a bare 64-digit digest (SHA-256). The hash is an integrity check against truncated,
corrupted or changed files, not a signature: the manifest sits beside the files it describes,
so whoever can rewrite a file can rewrite its digest too, whatever the algorithm.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import blake3
import xxhash

_PREFIX = {"xxh3-128": "xxh3-128:", "blake3": "blake3:", "sha256": ""}
DEFAULT = "xxh3-128"
"""The algorithm of new digests."""
DIGEST_RE = re.compile(r"xxh3-128:[0-9a-f]{32}|(?:blake3:)?[0-9a-f]{64}")
"""A digest as a manifest records it: ``xxh3-128:<hex>``, ``blake3:<hex>``, or bare hex for SHA-256."""
_NAMES = {"xxh3-128": "XXH3-128 hash", "blake3": "BLAKE3 hash", "sha256": "SHA-256"}


def algorithm_of(recorded: str | None) -> str:
    """The algorithm of a recorded digest ("xxh3-128", "blake3" or "sha256"); the default for None."""
    if recorded is None:
        return DEFAULT
    return next((name for name, prefix in _PREFIX.items() if prefix and recorded.startswith(prefix)), "sha256")


class Hasher:
    """Hashes bytes in the algorithm of a recorded digest (`DEFAULT` when there is none)."""

    def __init__(self, like: str | None = None) -> None:
        self.algorithm = algorithm_of(like)
        self.sha256 = self.algorithm == "sha256"
        """Whether the digest is SHA-256 (hashed in chunks: it gains nothing from a mapped file)."""
        self.default = self.algorithm == DEFAULT
        """Whether the digest is in the algorithm of new digests (`hash_file(path)` gives it)."""
        if self.algorithm == "xxh3-128":
            self._hash: Any = xxhash.xxh3_128()
        elif self.algorithm == "blake3":
            self._hash = blake3.blake3(max_threads=blake3.blake3.AUTO)
        else:
            self._hash = hashlib.sha256()

    def update(self, data: Any) -> None:
        """Add `data` (any buffer)."""
        self._hash.update(data)

    def text(self) -> str:
        """The digest as a manifest records it."""
        return _PREFIX[self.algorithm] + str(self._hash.hexdigest())


def name_of(recorded: str | None) -> str:
    """The algorithm of a recorded digest, for messages: "XXH3-128 hash", "BLAKE3 hash" or "SHA-256"."""
    return _NAMES[algorithm_of(recorded)]


def of_bytes(data: Any) -> str:
    """The digest of `data` in the default algorithm, as recorded."""
    hasher = Hasher()
    hasher.update(data)
    return hasher.text()
