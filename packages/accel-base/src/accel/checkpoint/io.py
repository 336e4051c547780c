"""Single checkpoint files: written atomically, hashed as they are written, verified as they are read.

- Weights are safetensors. Everything else is written with `torch.save` and read back with
  `torch.load(weights_only=True)`: a file that would need arbitrary code to unpickle is
  refused (`UnsafeCheckpointError`) and nothing in it runs.
- Every writer returns the file's digest (`accel.checkpoint.digest`: chunked XXH3-128; XXH3-128, BLAKE3 and SHA-256
  digests of manifests written before still verify). Bytes are hashed on their way to the file, on another thread while
  the write goes on: no second pass over the file, no second copy of it in memory.
- Safetensors files are written here tensor by tensor straight from the tensors' memory, each
  buffer hashed (on another thread) as it passes. A model's file is read in place: mapped from the
  page cache under a read lease and hashed there (`map_safetensors`), or, where no lease can be
  had, read straight into tensors of its own. A torch file is parsed by `torch.load` while a
  thread hashes the same file from the page cache.
- Damaged files fail with a `CheckpointError` naming the file and what is wrong; so does a
  FIFO, device or socket in a file's place, refused by its type before anything opens it (a
  FIFO would block the reader forever, `/dev/zero` would never end).
- Ctrl-C during a write surfaces as `KeyboardInterrupt`, never as the error torch's archive
  writer makes of it (`unexpected pos`); the temporary file is removed.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import mmap
import os
import re
import signal
import stat
import struct
import threading
import warnings
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # not on Windows: no leases, files are copied into memory of their own
    fcntl = None  # type: ignore[assignment]

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError, UnsafeCheckpointError
from .digest import Hasher, chunk_count, chunk_digests, chunked, combine, name_of, of_bytes

_CODE_MARKERS = ("Unsupported global", "unsupported GLOBAL", "Can only create new object", "Can only build")
_CHUNK = 1 << 22


_OVERLAP = 1 << 20  # buffers from this size on are hashed on another thread while they are written


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes what passes through it, large buffers while they are written."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.hasher = Hasher()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.nbytes < _OVERLAP:
            self.hasher.update(view)
            self.target.write(view)
            return view.nbytes
        # Both release the GIL: the hash runs beside the write, and is done before the caller may reuse `data`.
        pending = _hash_pool().submit(self.hasher.update, view)
        try:
            self.target.write(view)
        finally:
            pending.result()
        return view.nbytes

    def flush(self) -> None:
        self.target.flush()


def _replace_into(path: Path, write: Callable[[Path], Any]) -> Any:
    """Write through a temporary name in the same directory, then rename: all or nothing.

    A failed write (disk full, permissions) removes the temporary file before re-raising.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        result = write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result


def hash_file(path: str | os.PathLike[str], like: str | None = None) -> str:
    """The digest of a regular file, read in chunks, as a manifest records it.

    `like`: a recorded digest, whose algorithm is used (`accel.checkpoint.digest`); the default (chunked XXH3-128)
    when None.

    Raises:
        CheckpointError: `path` is a FIFO, device, socket or directory (naming it); nothing is read.
    """
    digest = Hasher(like)
    # O_NONBLOCK: opening a FIFO must not wait for a writer; its type is refused right after.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        check_regular(Path(path), st.st_mode)
        if not digest.sha256 and st.st_size >= _CHUNK:
            # Hashed from the page cache in place: no copy into a buffer.
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                digest.update(mapped)
            return digest.text()
        chunk = memoryview(bytearray(_CHUNK))
        while n := f.readinto(chunk):
            digest.update(chunk[:n])
    return digest.text()


def describe_type(mode: int) -> str:
    """What a non-regular file is, for messages ("a FIFO", "a character device", ...)."""
    kinds = [
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((what for test, what in kinds if test(mode)), "not a regular file")


def check_regular(path: Path, mode: int) -> None:
    """Raise a `CheckpointError` naming `path` unless `mode` is a regular file's."""
    if not stat.S_ISREG(mode):
        raise CheckpointError(
            f"Checkpoint file {path} is {describe_type(mode)}, not a regular file; accel reads only regular files. "
            "Put the checkpoint's file there, or load an earlier checkpoint."
        )


@functools.cache
def _hash_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="accel-hash")


def mismatch(path: Path, recorded: str) -> CheckpointError:
    """The error of a file whose bytes do not hash to the digest `recorded` for it."""
    return CheckpointError(
        f"Checkpoint file {path} does not match the {name_of(recorded)} recorded when it was saved: it is truncated "
        "or corrupted, or was changed after saving. Load an earlier checkpoint."
    )


def _read_verified(
    path: Path, sha256: str | None, parse: Callable[[Path], Any], share: SharedHashing | None = None
) -> Any:
    """`parse(path)` while a thread hashes the same file from the page cache.

    Memory holds what `parse` builds, never a second copy of the file; the two reads share the
    page cache, and the hash and file reads release the GIL, so verification overlaps
    deserialisation. The file's identity, size and modification time must be the same after both
    reads: a file replaced or rewritten in between fails instead of loading bytes the hash did not
    see. A hash mismatch wins over a parse error: it says more about what happened. With `share`
    (and a chunked digest), the thread hashes only this process's chunks and the digest is checked
    once every process of the node has sent its part (`check_shared`).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from None
    check_regular(path, mode)
    before = _identity(path)
    shared = share is not None and share.takes(sha256)
    digest: Future[Any] | None
    if shared:
        digest = _hash_pool().submit(share.hash_part, path, str(sha256))  # type: ignore[union-attr]
    else:
        # The default algorithm's digest is asked for as `hash_file(path)`, the call every caller makes.
        args = (path,) if sha256 is None or Hasher(sha256).default else (path, sha256)
        digest = _hash_pool().submit(hash_file, *args) if sha256 is not None else None
    try:
        result, error = parse(path), None
    except Exception as exc:
        result, error = None, exc
    if digest is not None and sha256 is not None:
        try:
            actual = digest.result()
        except OSError as exc:
            raise CheckpointError(f"Checkpoint file {path} could not be read ({exc}).") from exc
        if not shared and actual != sha256:
            raise mismatch(path, sha256) from error
        if _identity(path) != before:
            raise CheckpointError(f"Checkpoint file {path} changed while it was being read; load it again.")
    if error is not None:
        raise error
    return result


class SharedHashing:
    """This process's part in hashing the files that every process of its node reads (chunked digests).

    Of each such file it hashes the chunks ``i`` with ``(crc32(path) + i) % size == index`` and the
    other processes of the node hash the others: each byte is hashed once per node, not once per
    process. `hashed` is what it sends them in the round after reading (per file: its identity,
    recorded digest, size and this process's chunk digests); `check_shared` then puts every
    process's chunks together into each file's digest, on every process alike.
    """

    def __init__(self, index: int, size: int) -> None:
        self.index = index
        self.size = size
        self.hashed: dict[str, tuple[tuple[int, int, int, int], str, int, dict[int, bytes]]] = {}

    def takes(self, recorded: str | None) -> bool:
        """Whether a file recorded with this digest is hashed in shares (the default, chunked algorithm)."""
        return recorded is not None and chunked(recorded)

    def mine(self, path: Path, size: int) -> list[int]:
        """The chunks of `path` (of `size` bytes) this process hashes."""
        first = zlib.crc32(str(path).encode())
        return [i for i in range(chunk_count(size)) if (first + i) % self.size == self.index]

    def hash_part(self, path: Path, recorded: str, region: Any = None) -> None:
        """Hash this process's chunks of `path` (from `region`, the whole file mapped, or a mapping of its own)."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            identity = _identity(fd)
            size = identity[2]
            if region is None and size:
                with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                    digests = chunk_digests(mapped, self.mine(path, size))
            else:
                digests = chunk_digests(region if region is not None else b"", self.mine(path, size))
        finally:
            os.close(fd)
        self.hashed[str(path)] = (identity, recorded, size, digests)


def check_shared(parts: list[Any]) -> CheckpointError | None:
    """The error of the first file whose chunks, hashed by the processes of one node (each `SharedHashing.hashed`
    in `parts`), do not make the digest recorded for it, or that the processes did not all see the same; None
    when every file matches."""
    files: dict[str, list[Any]] = {}
    for part in parts:
        for key, entry in (part or {}).items():
            files.setdefault(key, []).append(entry)
    for key in sorted(files):
        entries = files[key]
        identity, recorded, size, _ = entries[0]
        if any(tuple(e[:3]) != (identity, recorded, size) for e in entries):
            return CheckpointError(f"Checkpoint file {key} changed while it was being read; load it again.")
        digests: dict[int, bytes] = {}
        for entry in entries:
            digests.update(entry[3])
        count = chunk_count(size)
        if set(digests) != set(range(count)):
            return CheckpointError(
                f"Checkpoint file {key} could not be verified: the processes that read it hashed chunks "
                f"{sorted(digests)} of {count}. Load it again."
            )
        if combine(digests[i] for i in range(count)) != recorded:
            return mismatch(Path(key), recorded)
    return None


def _interrupt_behind(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or SystemExit an exception was raised while handling, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, SystemExit)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _identity(target: Path | int) -> tuple[int, int, int, int]:
    """A file's device, inode, size and modification time, by path or open descriptor."""
    st = os.stat(target)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_crc_lock = threading.Lock()
_crc_users = 0
_crc_before = True


@contextlib.contextmanager
def _without_zip_crc() -> Any:
    """`torch.save` without the CRC-32 of each zip record (`torch.serialization.set_crc32_options`), while any
    save here runs: the manifest's digest covers every byte of the file, and the CRC was about 40% of
    `torch.save`'s CPU time here. Other threads' `torch.save` calls meanwhile skip it too; `torch.load` reads
    such files (zip tools report the missing CRCs)."""
    global _crc_users, _crc_before
    options = torch.serialization
    if not hasattr(options, "set_crc32_options"):
        yield
        return
    with _crc_lock:
        if _crc_users == 0:
            _crc_before = options.get_crc32_options()
            options.set_crc32_options(False)
        _crc_users += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_users -= 1
            if _crc_users == 0:
                options.set_crc32_options(_crc_before)


def save_torch(obj: Any, path: str | os.PathLike[str], *, zip_crc: bool = True) -> str:
    """`torch.save`, atomically. Returns the file's digest.

    `zip_crc=False`: without the zip records' CRC-32s (`_without_zip_crc`), for a checkpoint's own files, which
    its manifest's digests cover; files users take elsewhere (`save_model`'s weights) keep them.
    """

    def write(tmp: Path) -> str:
        with open(tmp, "wb") as f, contextlib.nullcontext() if zip_crc else _without_zip_crc():
            writer = _HashingWriter(f)
            try:
                torch.save(obj, writer)  # type: ignore[arg-type]  # a binary file object: torch only writes to it
            except Exception as exc:
                # torch's C++ archive writer turns an exception in `write` (Ctrl-C lands there
                # often) into its own RuntimeError ("unexpected pos"): raise the interrupt itself.
                interrupt = _interrupt_behind(exc)
                if interrupt is not None:
                    raise interrupt from None
                raise
        return writer.hasher.text()

    return str(_replace_into(Path(path), write))


def load_torch(
    path: str | os.PathLike[str],
    map_location: Any = "cpu",
    sha256: str | None = None,
    share: SharedHashing | None = None,
) -> Any:
    """`torch.load` restricted to tensors and plain containers.

    With `sha256`, the file's bytes must hash to it (with `share`, checked by `check_shared` once the
    processes of the node have hashed their parts).

    Raises:
        UnsafeCheckpointError: the file would execute code to load.
        CheckpointError: (naming the file) missing, truncated, corrupted or not matching `sha256`.
    """
    path = Path(path)

    def parse(source: Path) -> Any:
        try:
            return torch.load(source, map_location=map_location, weights_only=True)
        except Exception as exc:
            text = str(exc)
            # The weights-only unpickler also fails on plain damage ("Unsupported operand");
            # only a refused global or object construction means the file wanted to run code.
            if any(marker in text for marker in _CODE_MARKERS):
                raise UnsafeCheckpointError(
                    f"Refusing to load {path}: it contains objects that can only be rebuilt by running code "
                    f"from the file (unrestricted pickle), which could execute anything. Nothing in it was run. "
                    f"Only load checkpoints you trust, and re-save them with accel. Details: {_reason(text)}"
                ) from exc
            raise CheckpointError(
                f"Checkpoint file {path} could not be read ({type(exc).__name__}: {_reason(text)}); it is truncated "
                "or corrupted, or was not written by torch.save. Load an earlier checkpoint."
            ) from exc

    return _read_verified(path, sha256, parse, share)


def _reason(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # torch's weights-only error buries the cause under generic advice; keep the cause.
    cause = [line for line in lines if any(k in line for k in (*_CODE_MARKERS, "Unsupported operand"))]
    return (cause or lines or [""])[0].replace("WeightsUnpickler error: ", "")


def save_safetensors(
    state_dict: dict[str, torch.Tensor], path: str | os.PathLike[str], metadata: dict[str, str] | None = None
) -> str:
    """Save tensors as safetensors, atomically; returns the file's digest.

    Tensors sharing memory (tied weights) are copied. Each tensor's bytes go to the file from the
    tensor's own memory and are hashed on the way.
    """
    tensors = _detach_for_save(state_dict)
    meta = metadata or {"format": "pt"}

    def write(tmp: Path) -> str:
        if any(t.dtype not in _DTYPES for t in tensors.values()):
            save_file(tensors, str(tmp), metadata=meta)  # safetensors names the dtype it cannot store
            return hash_file(tmp)
        with open(tmp, "wb") as f:
            writer = _HashingWriter(f)
            _write_safetensors(tensors, writer, meta)
        return writer.hasher.text()

    return str(_replace_into(Path(path), write))


_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.complex64: "C64",
}
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}
_MAX_HEADER = 100 << 20  # what safetensors itself accepts


def _raw(tensor: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, as a writable buffer over its own memory."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


def _write_safetensors(tensors: dict[str, torch.Tensor], out: _HashingWriter, metadata: dict[str, str]) -> None:
    """The safetensors format: an 8-byte header length, the JSON header (padded to 8 bytes), the tensors' bytes."""
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    out.write(struct.pack("<Q", len(text)) + text)
    for name in sorted(tensors):
        if tensors[name].numel():
            out.write(_raw(tensors[name]))


def _plain_layout(f: BinaryIO, st: os.stat_result) -> tuple[bytes, list[tuple[str, dict[str, Any]]]] | None:
    """The header bytes (length prefix included) and the entries by offset of a safetensors file read from its
    start; None where its layout is anything but plain: tensors back to back, in order, filling the file."""
    head = f.read(8)
    if len(head) < 8 or (size := struct.unpack("<Q", head)[0]) > min(_MAX_HEADER, st.st_size - 8):
        return None
    text = f.read(size)
    try:
        header = json.loads(text)
        entries = sorted(
            ((k, v) for k, v in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]
        )
        end = 0
        for _, info in entries:
            begin, stop = info["data_offsets"]
            dtype = _BY_NAME[info["dtype"]]
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            if begin != end or stop - begin != count * dtype.itemsize:
                return None
            end = stop
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        return None
    if len(text) != size or 8 + size + end != st.st_size:
        return None
    return head + text, entries


def _read_safetensors(path: Path, sha256: str | None) -> dict[str, torch.Tensor] | None:
    """Read (and with `sha256`, verify) a safetensors file in one pass; None where its layout is anything but
    plain (the caller then reads it with safetensors, which names what is wrong).

    Each tensor is read straight into its own memory; the bytes are hashed on another thread while the
    next tensor is read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        check_regular(path, st.st_mode)
        layout = _plain_layout(f, st)
        if layout is None:
            return None
        header, entries = layout
        hasher = Hasher(sha256) if sha256 is not None else None
        if hasher is not None:
            hasher.update(header)
        pending = None
        out: dict[str, torch.Tensor] = {}
        try:
            for name, info in entries:
                t = torch.empty([int(d) for d in info["shape"]], dtype=_BY_NAME[info["dtype"]])
                out[name] = t
                if not t.numel():
                    continue
                buf = memoryview(_raw(t))
                done = 0
                while done < buf.nbytes:
                    n = f.readinto(buf[done:])
                    if not n:
                        return None  # shorter than when it was measured: read it the careful way
                    done += n
                if hasher is not None:
                    if pending is not None:
                        pending.result()
                    pending = _hash_pool().submit(hasher.update, buf)
        finally:
            if pending is not None:
                pending.result()
    if hasher is not None and sha256 is not None and hasher.text() != sha256:
        raise mismatch(path, sha256)
    return out


class MappedWeights:
    """A safetensors file's tensors read in place from the page cache, under a read lease on the file.

    The tensors are views of a private mapping of the file: nothing is copied until they are loaded
    into a model. While the lease is held, the kernel holds back any other process that opens the file
    for writing or truncates it (for up to ``/proc/sys/fs/lease-break-time`` seconds), so the bytes the
    model receives are the bytes that were hashed, and the mapping cannot lose pages under a reader.
    Replacing or deleting the file meanwhile does not touch the mapping either. `release` ends the
    lease; it must be called once the tensors have been copied where they go.
    """

    def __init__(
        self, path: Path, fd: int, tensors: dict[str, torch.Tensor], digest: Any, recorded: str | None, shared: bool
    ) -> None:
        self.path = path
        self.tensors = tensors
        self._fd: int | None = fd
        self._digest = digest
        self._recorded = recorded
        self._shared = shared
        self._opened_as = _identity(fd)

    def verify(self) -> dict[str, torch.Tensor]:
        """The tensors, once the file's bytes are known to hash to the recorded digest (when one was given), or
        once this process's chunks are hashed, where the processes of a node share the work (`SharedHashing`).

        Raises:
            CheckpointError: the bytes do not match, or the file changed since it was mapped (naming it).
        """
        if self._digest is not None:
            try:
                actual = self._digest.result()
            except OSError as exc:
                raise CheckpointError(f"Checkpoint file {self.path} could not be read ({exc}).") from exc
            if not self._shared and actual != self._recorded:
                raise mismatch(self.path, str(self._recorded))
            self._digest = None
        self.check_unchanged()
        return self.tensors

    def check_unchanged(self, *, applied: bool = False) -> None:
        """Raise a `CheckpointError` if the file was written or truncated since it was mapped (possible only
        once the kernel breaks a lease that a writer has waited for longer than the lease-break time).

        `applied`: the tensors were already copied into the model, whose weights the message then disowns.
        """
        if self._fd is not None and _identity(self._fd) == self._opened_as:
            return
        if applied:
            raise CheckpointError(
                f"Checkpoint file {self.path} was changed by another process while it was being loaded into the "
                "model, so the model's weights may not be the checkpoint's. Load it again once nothing writes to it."
            )
        raise CheckpointError(
            f"Checkpoint file {self.path} was changed by another process while it was being read. Nothing was "
            "loaded: load it again once nothing writes to it."
        )

    def release(self) -> None:
        """End the lease and close the file (the tensors stay readable until they are dropped)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._digest is not None:
            self._digest.cancel()
            try:
                self._digest.result()
            except BaseException:  # a hash nobody asked for any more: only its end matters
                pass
        _unlease(fd)
        os.close(fd)


def _lease(fd: int) -> bool:
    """Take a read lease on `fd` (Linux), signalled with SIGURG, whose default is to be ignored: SIGIO's
    default would end the process when a writer breaks the lease. False where none can be had (another
    platform, a file open for writing, a file system without leases, a file owned by another user)."""
    if fcntl is None or not hasattr(fcntl, "F_SETLEASE"):
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    if fcntl.fcntl(fd, fcntl.F_GETSIG) != signal.SIGURG or fcntl.fcntl(fd, fcntl.F_GETLEASE) != fcntl.F_RDLCK:
        _unlease(fd)
        return False
    return True


def _unlease(fd: int) -> None:
    """End a lease on `fd`, if it holds one."""
    if fcntl is not None and hasattr(fcntl, "F_SETLEASE"):
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)


def map_safetensors(
    path: str | os.PathLike[str], sha256: str | None = None, share: SharedHashing | None = None
) -> MappedWeights | None:
    """Map a plain safetensors file under a read lease, its hash started on another thread (`MappedWeights`);
    with `share`, only this process's chunks are hashed (`SharedHashing`).

    None where the file cannot be leased or its layout is not plain: read it with `load_safetensors`,
    which copies it into memory of its own and names what is wrong.

    Raises:
        CheckpointError: the file is missing, or not a regular file (naming it).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from None
    mapped: MappedWeights | None = None
    try:
        st = os.fstat(fd)
        check_regular(path, st.st_mode)
        # The lease first: from here on no other process can change the bytes about to be parsed and hashed.
        if st.st_size == 0 or not _lease(fd):
            return None
        with open(fd, "rb", buffering=0, closefd=False) as f:
            layout = _plain_layout(f, st)
        if layout is None:
            return None
        header, entries = layout
        region = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        tensors: dict[str, torch.Tensor] = {}
        start = len(header)
        with warnings.catch_warnings():
            # frombuffer's note that the buffer is shared: it is a private mapping, and nothing writes to it here
            warnings.simplefilter("ignore")
            for name, info in entries:
                dtype, shape = _BY_NAME[info["dtype"]], [int(d) for d in info["shape"]]
                begin, stop = info["data_offsets"]
                if stop == begin:
                    tensors[name] = torch.empty(shape, dtype=dtype)
                else:
                    count = (stop - begin) // dtype.itemsize
                    tensors[name] = torch.frombuffer(region, dtype=dtype, count=count, offset=start + begin).view(shape)
        shared = share is not None and share.takes(sha256)
        digest: Future[Any] | None
        if shared:
            digest = _hash_pool().submit(share.hash_part, path, str(sha256), region)  # type: ignore[union-attr]
        else:
            digest = _hash_pool().submit(of_bytes, region, sha256) if sha256 is not None else None
        mapped = MappedWeights(path, fd, {k: tensors[k] for k in sorted(tensors)}, digest, sha256, shared)
        return mapped
    finally:
        if mapped is None:
            _unlease(fd)
            os.close(fd)


def load_safetensors(
    path: str | os.PathLike[str], device: str = "cpu", sha256: str | None = None
) -> dict[str, torch.Tensor]:
    """Read a safetensors file (verified against `sha256` when given).

    Raises:
        CheckpointError: (naming the file) missing, not valid safetensors, or not matching `sha256`.
    """
    path = Path(path)
    try:
        fast = _read_safetensors(path, sha256)
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint file {path} is missing.") from None
    except OSError:
        fast = None  # the careful read below names what is wrong
    if fast is not None:
        if device != "cpu":
            fast = {k: v.to(device) for k, v in fast.items()}
        return {k: fast[k] for k in sorted(fast)}

    def parse(source: Path) -> dict[str, torch.Tensor]:
        try:
            # Each tensor is copied out of the file's mapping once; the mapping itself is the page cache.
            return load_file(str(source), device=device)  # type: ignore[no-any-return]
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"Checkpoint file {path} is not valid safetensors ({exc}); it is truncated or corrupted."
            ) from exc

    tensors = _read_verified(path, sha256, parse)
    # Every rank must walk a state dict in the same order (FSDP scatters key by key).
    return {k: tensors[k] for k in sorted(tensors)}


def load_json(path: str | os.PathLike[str], sha256: str | None = None) -> Any:
    """Parse a JSON checkpoint file; any damage (bad bytes, bad UTF-8, bad JSON) is a `CheckpointError` naming it."""
    path = Path(path)

    def parse(source: Path) -> Any:
        try:
            return json.loads(source.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"Checkpoint file {path} is corrupted ({exc}). Load an earlier checkpoint.") from exc

    return _read_verified(path, sha256, parse)


def save_json(obj: Any, path: str | os.PathLike[str]) -> str:
    """Write `obj` as JSON, atomically; returns the file's digest."""
    data = json.dumps(obj, indent=2).encode("utf-8")

    def write(tmp: Path) -> str:
        tmp.write_bytes(data)
        return of_bytes(data)

    return str(_replace_into(Path(path), write))


def _detach_for_save(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        t = tensor.detach().to("cpu")
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset())) if t.numel() else (id(t), 0)
        # safetensors refuses tensors that share memory; a tied weight is saved as its own copy
        # so the file loads strictly into a plain module.
        t = t.clone() if key in seen else t.contiguous()
        seen.add(key)
        out[name] = t
    return out


# ---- save_model ---------------------------------------------------------------------------
def parse_size(size: int | str) -> int:
    """'10GB' / '500MB' / 1024 -> bytes."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)\s*", size.upper())
    if not m:
        raise ValueError(f"max_shard_size must be an int or a string like '10GB', got {size!r}.")
    powers = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
    unit = m.group(2)
    base = 1024 if "I" in unit else 1000
    return int(float(m.group(1)) * base ** powers[unit[0] if unit[0] in "KMGT" else ""])


def write_model_files(
    state_dict: dict[str, torch.Tensor],
    save_directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> list[Path]:
    """Write a full state dict as `model.safetensors`, or shards plus `model.safetensors.index.json`."""
    directory = Path(save_directory)
    if directory.is_file():
        raise ValueError(f"save_model needs a directory, but {directory} is a file.")
    directory.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    ext = "safetensors" if safe_serialization else "bin"
    if len(shards) == 1:
        path = directory / f"model.{ext}"
        write_weights(shards[0], path, safe_serialization)
        return [path]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        path = directory / f"model-{i:05d}-of-{len(shards):05d}.{ext}"
        write_weights(shard, path, safe_serialization)
        weight_map.update({k: path.name for k in shard})
        written.append(path)
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state_dict.values())},
        "weight_map": weight_map,
    }
    index_path = directory / f"model.{ext}.index.json"
    save_json(index, index_path)
    return [*written, index_path]


def write_weights(state_dict: dict[str, torch.Tensor], path: Path, safe: bool) -> str:
    """A model's weights as safetensors (`safe`) or a weights-only torch file; returns the digest."""
    if safe:
        return save_safetensors(state_dict, path)
    return save_torch(_detach_for_save(state_dict), path)
