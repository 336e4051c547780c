"""Sharded checkpoints (torch.distributed.checkpoint folders), read without unrestricted pickle.

A sharded save writes each model into `pytorch_model_fsdp_<i>/` and each optimizer into
`optimizer_<i>/` (Accelerate's names). `load_into` reads such a folder into the live shards of
any world size (collective); `read_full` reads it whole into plain tensors in one process, for
a run that does not shard (one process, DDP) and for `accel merge-weights`.

torch.distributed.checkpoint reads its `.metadata` with plain `pickle.load` and its
non-tensor items with `torch.load(weights_only=False)`; both are replaced here by
restricted readers, so a crafted checkpoint cannot run code (the rule of `accel.checkpoint`).
"""

from __future__ import annotations

import io
import itertools
import math
import os
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError, UnsafeCheckpointError
from .io import check_regular

SHARDED_NAME = re.compile(r"(pytorch_model_fsdp|optimizer)_\d+")
"""A sharded folder's name: `pytorch_model_fsdp_<i>` (a model) or `optimizer_<i>` (an optimizer)."""


def model_folder(i: int) -> str:
    """The folder of the i-th model's shards."""
    return f"pytorch_model_fsdp_{i}"


def optimizer_folder(i: int) -> str:
    """The folder of the i-th optimizer's shards."""
    return f"optimizer_{i}"


def saved_entries(folder: Path, prefix: str) -> dict[str, Any]:
    """The entries under `prefix` of a sharded folder's metadata: tensors as meta tensors of the saved shape."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = safe_reader(folder).read_metadata()
    return {
        key[len(prefix) :]: torch.empty(item.size, device="meta") if isinstance(item, TensorStorageMetadata) else item
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(prefix)
    }


def read_full(folder: Path, read: list[Path] | None = None) -> dict[str, Any]:
    """Everything a sharded folder holds, whole, in host memory, read by this process alone.

    Returns the state as saved (`{"model": {...}}` or `{"optimizer": {"state": ..., "param_groups": ...}}`),
    every tensor gathered from all of the saving run's shards. Needs memory for the whole object; no other
    process takes part, so a rank that reads while another fails waits in no collective. Appends every
    file it reads to `read`.

    Raises:
        CheckpointError: missing metadata, damaged or incomplete shards, a shard that is not a regular file
            inside `folder`, tensor sizes the shard files cannot hold. UnsafeCheckpointError: an item would run code.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = safe_reader(folder).read_metadata()
    files = shard_files(folder, metadata)
    if read is not None:
        read += [folder / ".metadata", *(path for path, _ in files)]
    budget = None if _transformed(metadata) else sum(size for _, size in files)
    target: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        # Non-tensor items (hyperparameters, parameter names) are filled in by the planner's load_bytes.
        value = _empty(folder, key, item, budget) if isinstance(item, TensorStorageMetadata) else None
        _place(target, (metadata.planner_data or {}).get(key, (key,)), value)
    with warnings.catch_warnings():  # reading without a process group is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_into(target, folder, no_dist=True)
    return target


def regular_size(path: Path) -> int:
    """`path`'s size, once it is known to be a regular file (a FIFO would block its reader forever)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CheckpointError(f"Sharded checkpoint file {path} cannot be read ({exc.strerror}).") from None
    check_regular(path, st.st_mode)
    return st.st_size


def shard_files(folder: Path, metadata: Any) -> list[tuple[Path, int]]:
    """The data files `metadata` points into, each checked (a plain name inside `folder`, regular) with its size."""
    names = sorted({info.relative_path for info in (metadata.storage_data or {}).values()})
    files = []
    for name in names:
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(
                f"{folder / '.metadata'} points at {str(name)[:200]!r}, which is not a file in {folder}; nothing was "
                "read. The metadata is corrupted."
            )
        files.append((folder / name, regular_size(folder / name)))
    return files


def _transformed(metadata: Any) -> bool:
    """Whether any item was stored through an extension (compressed): its stored size says nothing of its own."""
    return any(getattr(info, "transform_descriptors", None) for info in (metadata.storage_data or {}).values())


def _empty(folder: Path, fqn: str, meta: Any, budget: int | None) -> torch.Tensor:
    """An empty tensor for `meta`, refused when its size is impossible (more bytes than the shard files hold)."""
    shape = tuple(meta.size)
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise CheckpointError(f"{folder / '.metadata'} records tensor {fqn!r} with shape {shape}: it is corrupted.")
    nbytes = meta.properties.dtype.itemsize * math.prod(shape)
    if budget is not None and nbytes > budget:
        raise CheckpointError(
            f"{folder / '.metadata'} records tensor {fqn!r} of shape {shape} ({nbytes} bytes), more than its shard "
            f"files hold ({budget} bytes): the metadata is corrupted. Nothing was read."
        )
    try:
        return torch.empty(shape, dtype=meta.properties.dtype)
    except (RuntimeError, MemoryError) as exc:
        raise CheckpointError(
            f"Cannot hold tensor {fqn!r} of shape {shape} ({nbytes} bytes) in memory to read it whole "
            f"({str(exc).splitlines()[0][:200]}). Read it on a machine with more memory."
        ) from None


def _place(tree: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    """Set `tree[path[0]][path[1]]... = value`, creating the dicts and lists (an int key: a list) on the way."""
    node: Any = tree
    for key, below in itertools.pairwise(path):
        empty: Any = [] if isinstance(below, int) else {}
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            node[key] = empty if node[key] is None else node[key]
        else:
            node.setdefault(key, empty)
        node = node[key]
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def load_into(target: dict[str, Any], folder: Path, *, no_dist: bool = False, planner: type[Any] | None = None) -> None:
    """Read the sharded folder into `target` in place (its tensors or DTensors say which part each rank reads).

    Collective over the default group unless `no_dist`. `planner`: the load planner class to read with (an
    adapter's, for tensors of its own sharded type; default torch's `DefaultLoadPlanner`), its non-tensor items
    read without unrestricted unpickling either way.

    Raises:
        CheckpointError: damaged or incomplete shards, or a folder saved from another model.
        UnsafeCheckpointError: an item would need arbitrary code to load.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(target, storage_reader=safe_reader(folder), planner=_safe_planner(planner), no_dist=no_dist)
    except CheckpointException as exc:
        errors = [failure[0] for failure in exc.failures.values()]
        unsafe = [e for e in errors if isinstance(e, UnsafeCheckpointError)]
        if unsafe:
            raise unsafe[0] from exc
        first = errors[0] if errors else exc
        raise CheckpointError(
            f"Sharded checkpoint {folder} could not be read ({type(first).__name__}: {first}); "
            "it is incomplete or corrupted, or was saved from a different model."
        ) from exc


_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Rebuilds only the plain records torch.distributed.checkpoint writes in `.metadata`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        ):
            return getattr(torch, name)
        if module in _METADATA_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:
                return found
        raise UnsafeCheckpointError(
            f"Refusing to load the sharded checkpoint metadata: it references {module}.{name}, which a "
            "torch.distributed.checkpoint metadata file never contains and which could run code. Nothing was run."
        )


def safe_reader(path: Path) -> Any:
    """A `FileSystemReader` for `path` whose metadata is read by a restricted unpickler."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")
            meta_path = path / (".metadata" if rank is None else f"__{rank}.metadata")
            if not meta_path.is_file():
                raise CheckpointError(f"Sharded checkpoint {path} has no metadata file ({meta_path.name}).")
            regular_size(meta_path)
            with open(meta_path, "rb") as f:
                try:
                    metadata = _MetadataUnpickler(f).load()
                except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
                    raise CheckpointError(f"{meta_path} is truncated or corrupted ({exc}).") from exc
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"{meta_path} is not torch.distributed.checkpoint metadata.")
            shard_files(path, metadata)  # plain names inside the folder, regular files: never read outside it
            storage_meta = metadata.storage_meta or StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            return metadata

    return SafeFileSystemReader(str(path))


def _safe_planner(base: type[Any] | None = None) -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(base or DefaultLoadPlanner):  # type: ignore[misc]
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError as exc:
                raise UnsafeCheckpointError(
                    f"Refusing to load item {read_item.dest_index.fqn!r} of a sharded checkpoint: it needs "
                    f"arbitrary code to unpickle. Nothing in it was run. ({str(exc).splitlines()[0]})"
                ) from exc
            # The parent unpickles without restriction; hand it a stream re-serialised from
            # the already verified object, so what it reads is only what was just allowed.
            clean = io.BytesIO()
            torch.save(obj, clean)
            clean.seek(0)
            super().load_bytes(read_item, clean)

    return SafeLoadPlanner()
