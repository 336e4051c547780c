"""Automatic checkpoints (`<project_dir>/checkpoints/checkpoint_<n>`): finding them, and rotating old ones out.

Rotation removes only the files a checkpoint's manifest lists, under the directory's locks
(`accel.checkpoint.lock`), and never follows a symbolic link: a linked `checkpoint_<n>` is
neither counted nor deleted.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

from ..errors import CheckpointError
from .layout import MANIFEST, REPLACED, STAGING, is_complete, locate, ours, owned_names, remove_entry
from .lock import CheckpointLocks

_CHECKPOINT_RE = re.compile(r"^checkpoint_(\d+)$")


def list_checkpoints(project_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete automatic checkpoints under `<project_dir>/checkpoints`, oldest first."""
    root = Path(project_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _CHECKPOINT_RE.match(entry.name)
        if m and entry.is_dir() and is_complete(entry):
            found.append((int(m.group(1)), entry))
    return sorted(found)


def checkpoint_number(directory: str | os.PathLike[str]) -> int | None:
    """N for an automatic checkpoint directory `checkpoint_N`, else None."""
    m = _CHECKPOINT_RE.match(Path(directory).name)
    return int(m.group(1)) if m else None


def prune(project_dir: str | os.PathLike[str], total_limit: int, keep: Iterable[Path] = ()) -> None:
    """Delete the oldest automatic checkpoints beyond `total_limit` (only the files accel wrote).

    A `checkpoint_<n>` that is a symbolic link is neither counted nor deleted (deleting would
    reach through it), with a `UserWarning` naming it.
    """
    keep = {Path(p) for p in keep}
    found = [p for _, p in list_checkpoints(project_dir) if p not in keep]
    linked = [p for p in found if p.is_symlink()]
    if linked:
        warnings.warn(
            f"Checkpoint rotation (total_limit) skips {', '.join(str(p) for p in linked)}: a symbolic link, and accel "
            "never deletes through a link. Remove the link yourself, or put the checkpoint's folder in its place.",
            UserWarning,
            stacklevel=3,
        )
    existing = [p for p in found if p not in linked]
    excess = len(existing) + len(keep) - total_limit
    for path in existing[: max(0, excess)]:
        remove_checkpoint(path)


def remove_checkpoint(directory: Path) -> None:
    """Remove the files of the checkpoint at `directory` (manifest first), and the directory if that empties it.

    Takes the directory's locks: a checkpoint a save is writing into is kept, and so is one a load
    still reads after `lock.WAIT_SECONDS` (each with a `UserWarning`, never an error: rotation runs on
    the main process only, and must not leave the others waiting). Links are removed as links.

    Raises:
        CheckpointError: `directory` is a symbolic link.
    """
    if directory.is_symlink():
        raise CheckpointError(f"{directory} is a symbolic link: accel does not delete a checkpoint through a link.")
    locks = CheckpointLocks(directory, "removing an old checkpoint")
    try:
        try:
            locks.save.take(exclusive=True, what=locks.what, wait=False)
            locks.save.note_holder(locks.what)
            locks.change_files()
        except CheckpointError as exc:
            warnings.warn(f"Kept checkpoint {directory}: {exc}", UserWarning, stacklevel=4)
            return
        found = locate(directory)
        if found is None:
            return
        (directory / MANIFEST).unlink(missing_ok=True)
        for name in owned_names(found.manifest):
            remove_entry(directory / name)
        for name in (STAGING, REPLACED):
            if ours(directory / name):
                remove_entry(directory / name)
        locks.release()  # an exclusive holder removes the lock files: then nothing of accel's is left
        if not any(directory.iterdir()):
            directory.rmdir()
    finally:
        locks.release()
