"""The integrity hash of checkpoint files, and the text a manifest records it as.

New manifests record chunked XXH3-128 digests as ``"xxh3-128/16MiB:<32 hex digits>"``: the
XXH3-128 of the concatenated 16-byte XXH3-128 digests (canonical, big-endian) of the file's
consecutive 16 MiB chunks, the last one shorter (an empty file has no chunk). XXH3 hashes at many
times memory speed on one core, so verifying a file costs a small part of reading it, and since
each chunk is hashed on its own, processes that read the same files can share the work: each
hashes some of the chunks (`chunk_digests`) and any of them can finish the digest (`combine`).
Digests recorded before still verify, each in its own algorithm: ``"xxh3-128:<32 hex digits>"``
(XXH3-128 of the whole file), ``"blake3:<64 hex digits>"`` (BLAKE3) and a bare 64-digit digest
(SHA-256). The hash is an integrity check against truncated, corrupted or changed files, not a
signature: the manifest sits beside the files it describes, so whoever can rewrite a file can
rewrite its digest too, whatever the algorithm.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

import blake3
import xxhash

CHUNK = 16 << 20
"""The chunk size of the default algorithm's digests, in bytes."""
_PREFIX = {"xxh3-128/16MiB": "xxh3-128/16MiB:", "xxh3-128": "xxh3-128:", "blake3": "blake3:", "sha256": ""}
DEFAULT = "xxh3-128/16MiB"
"""The algorithm of new digests."""
DIGEST_RE = re.compile(r"xxh3-128(?:/16MiB)?:[0-9a-f]{32}|(?:blake3:)?[0-9a-f]{64}")
"""A digest as a manifest records it: ``xxh3-128/16MiB:<hex>``, ``xxh3-128:<hex>``, ``blake3:<hex>``, or bare
hex for SHA-256."""
_NAMES = {"xxh3-128/16MiB": "XXH3-128 hash", "xxh3-128": "XXH3-128 hash", "blake3": "BLAKE3 hash", "sha256": "SHA-256"}


def algorithm_of(recorded: str | None) -> str:
    """The algorithm of a recorded digest ("xxh3-128/16MiB", "xxh3-128", "blake3" or "sha256"); the default for
    None."""
    if recorded is None:
        return DEFAULT
    return next((name for name, prefix in _PREFIX.items() if prefix and recorded.startswith(prefix)), "sha256")


class _Chunked:
    """XXH3-128 of the XXH3-128 digests of consecutive `CHUNK`-byte chunks, fed in pieces of any size."""

    def __init__(self) -> None:
        self._outer = xxhash.xxh3_128()
        self._inner = xxhash.xxh3_128()
        self._filled = 0

    def update(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            take = min(CHUNK - self._filled, view.nbytes)
            self._inner.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == CHUNK:
                self._outer.update(self._inner.digest())
                self._inner.reset()
                self._filled = 0

    def hexdigest(self) -> str:
        outer = self._outer.copy()
        if self._filled:
            outer.update(self._inner.digest())
        return str(outer.hexdigest())


class Hasher:
    """Hashes bytes in the algorithm of a recorded digest (`DEFAULT` when there is none)."""

    def __init__(self, like: str | None = None) -> None:
        self.algorithm = algorithm_of(like)
        self.sha256 = self.algorithm == "sha256"
        """Whether the digest is SHA-256 (hashed in chunks: it gains nothing from a mapped file)."""
        self.default = self.algorithm == DEFAULT
        """Whether the digest is in the algorithm of new digests (`hash_file(path)` gives it)."""
        if self.algorithm == DEFAULT:
            self._hash: Any = _Chunked()
        elif self.algorithm == "xxh3-128":
            self._hash = xxhash.xxh3_128()
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


def chunked(recorded: str | None) -> bool:
    """Whether a recorded digest is made of chunk digests (so that its work can be shared)."""
    return algorithm_of(recorded) == DEFAULT


def chunk_count(size: int) -> int:
    """How many chunks a file of `size` bytes has in the default algorithm."""
    return -(-size // CHUNK)


def chunk_digests(data: Any, indexes: Iterable[int]) -> dict[int, bytes]:
    """The 16-byte digests of the chunks `indexes` of `data` (a buffer of the whole file: a mapping, say)."""
    view = memoryview(data).cast("B")
    return {i: xxhash.xxh3_128(view[i * CHUNK : (i + 1) * CHUNK]).digest() for i in indexes}


def combine(digests: Iterable[bytes]) -> str:
    """The recorded digest of a file from the digests of all its chunks, in order."""
    outer = xxhash.xxh3_128()
    for digest in digests:
        outer.update(digest)
    return _PREFIX[DEFAULT] + str(outer.hexdigest())


def name_of(recorded: str | None) -> str:
    """The algorithm of a recorded digest, for messages: "XXH3-128 hash", "BLAKE3 hash" or "SHA-256"."""
    return _NAMES[algorithm_of(recorded)]


def of_bytes(data: Any, like: str | None = None) -> str:
    """The digest of `data` (any buffer) as recorded, in the algorithm of the recorded digest `like` (the default
    for None)."""
    hasher = Hasher(like)
    hasher.update(data)
    return hasher.text()
