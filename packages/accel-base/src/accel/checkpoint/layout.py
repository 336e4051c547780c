"""Where a checkpoint's files live, and how a new checkpoint replaces an old one in place.

A checkpoint directory may hold the user's own files (logs, configs, the training script
when it is the working directory): accel replaces only the files its manifest lists and
never touches anything else.

A save writes every file into `<dir>/.accel-staging`, and its manifest last. Committing
then moves the previous checkpoint's files into `<dir>/.accel-replaced` (its manifest
first), moves the new files up, and moves the new manifest up last; the two hidden
directories are removed afterwards. A kill at any instant leaves one loadable checkpoint:

- `<dir>/accel_checkpoint.json` exists: that checkpoint (leftover hidden directories are
  debris of a finished commit);
- otherwise a complete `.accel-staging` (manifest present): the new checkpoint, its files
  either still in staging or already moved up; the next save finishes the move first;
- otherwise none (the new one was not complete, and the old manifest was never moved).

Only names accel creates are ever removed or moved, and only when they carry accel's mark:
the staging directories hold a marker file (`.accel-owned`) from the moment they are made, and
a folder of those names without it (and not empty, nor a finished staging with a manifest) makes
the save stop with a `CheckpointError` saying to move it. Nothing here follows a symbolic link: a
link is removed as a link, never through, and rotation skips a linked `checkpoint_<n>`. Every
name a manifest lists must be a relative path inside the checkpoint (`Located.path` refuses a
link out of it and anything that is not a regular file or a directory).

Checkpoints written by accel before this layout (renamed into place whole) still load,
including `<dir>.accel-old` left by a crash between that layout's two renames. Those
siblings (`<dir>.accel-old`, `<dir>.accel-tmp`) carry no mark, so they are never removed:
a save that finds a complete `<dir>.accel-old` says so once, and leaves it to the user.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from .digest import DIGEST_RE
from .io import describe_type, load_json, save_json

MANIFEST = "accel_checkpoint.json"
STAGING = ".accel-staging"
REPLACED = ".accel-replaced"
MARKER = ".accel-owned"
"""A file accel writes into each staging directory it makes: only a directory holding it (or empty) is removed."""
TMP_SUFFIX = ".accel-tmp"
"""Suffix of the sibling temporary directory of accel releases before in-place saves (never removed: no mark)."""
OLD_SUFFIX = ".accel-old"
"""Suffix of the sibling directory those releases left when killed between their two renames."""
FORMAT_VERSION = 2
# Names accel writes into a checkpoint that Accelerate's save_state writes too (or an accel
# checkpoint whose manifest was lost leaves): `seal` replaces such a file when it holds a checkpoint.
_CHECKPOINT_FILE_RE = re.compile(
    r"(?:model|optimizer|scheduler)(?:_\d+)?\.(?:safetensors|bin)|scaler\.pt|custom_checkpoint_\d+\.bin"
    r"|random_states_\d+\.pt|dataloaders\.json"
)
_CHECKPOINT_DIR_RE = re.compile(r"pytorch_model_fsdp_\d+|optimizer_\d+")
# Files only Accelerate writes: never touched, but named when an Accelerate checkpoint is replaced.
_ACCELERATE_ONLY_RE = re.compile(
    r"random_states_\d+\.pkl|custom_checkpoint_\d+\.pkl|(?:sampler|dl_state_dict)(?:_\d+)?\.bin"
    r"|pytorch_model(?:_\d+)?\.bin"
)


@dataclass(frozen=True)
class Located:
    """A complete checkpoint found on disk: its manifest and where each of its files is."""

    directory: Path
    manifest: dict[str, Any]
    staged: Path | None = None
    """Set when a commit was interrupted: files not yet moved up are still here."""
    hashes: dict[str, str] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        """The file (or strategy directory) `name` of this checkpoint.

        Raises:
            CheckpointError: `name` is a link out of the checkpoint directory, or neither a regular
                file nor a directory (a FIFO, a device). A missing file is returned: its reader names it.
        """
        if not safe_name(name):
            raise CheckpointError(f"{name!r} is not a file inside the checkpoint {self.directory}.")
        if self.staged is not None and os.path.lexists(self.staged / name):
            return inside(self.directory, self.staged / name)
        return inside(self.directory, self.directory / name)

    def sha256(self, name: str) -> str | None:
        """The recorded digest of `name` (None for checkpoints written before hashes): chunked XXH3-128 as
        ``xxh3-128/16MiB:<hex>``, or from manifests written before, ``xxh3-128:<hex>`` (whole-file XXH3-128),
        ``blake3:<hex>`` (BLAKE3) or bare hex (SHA-256)
        (`accel.checkpoint.digest`)."""
        return self.hashes.get(name)


def file_name(kind: str, i: int, ext: str) -> str:
    """The file of the i-th prepared object of a kind: `optimizer.bin`, `optimizer_1.bin`, ..."""
    return f"{kind}.{ext}" if i == 0 else f"{kind}_{i}.{ext}"


def owned_names(manifest: dict[str, Any]) -> list[str]:
    """Top-level names a manifest says accel wrote (files and strategy directories)."""
    names = [*manifest.get("files", []), *manifest.get("rng_files", [])]
    return [n for n in dict.fromkeys(str(n).split("/")[0] for n in names) if n and n not in (".", "..")]


def safe_name(name: str) -> bool:
    """Whether `name` is a relative path that stays inside the folder it is joined to (no `..`, not absolute)."""
    parts = name.split("/")
    return bool(name) and "\\" not in name and "\0" not in name and all(p not in ("", ".", "..") for p in parts)


def inside(root: Path, path: Path) -> Path:
    """`path`, checked to resolve inside `root` and to be a regular file or a directory (when it exists).

    Raises:
        CheckpointError: a link out of `root`, or a FIFO, device or socket (naming it).
    """
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        parts = ()
    if ".." in parts:
        parts = ()  # resolved below
    mode = None
    for i in range(len(parts)):  # one lstat per name below `root`, where none is a link (the usual case)
        try:
            mode = os.lstat(root.joinpath(*parts[: i + 1])).st_mode
        except OSError:
            return path  # missing: its reader names it
        if stat.S_ISLNK(mode):
            mode = None
            break
    if mode is not None:
        _check_kind(path, mode)
        return path
    if not os.path.lexists(path):
        return path
    target = path.resolve()
    if not target.is_relative_to(root.resolve()):
        raise CheckpointError(
            f"Checkpoint file {path} is a link to {target}, outside the checkpoint directory {root}; accel reads "
            "only files inside it. Replace the link with the file itself."
        )
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return path  # a dangling link: its reader reports the file missing
    _check_kind(path, mode)
    return path


def _check_kind(path: Path, mode: int) -> None:
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise CheckpointError(
            f"Checkpoint file {path} is {describe_type(mode)}, not a regular file; accel reads only regular files. "
            "Load an earlier checkpoint."
        )


def _read_manifest(path: Path) -> dict[str, Any]:
    manifest = load_json(inside(path.parent, path))
    if not isinstance(manifest, dict):
        raise CheckpointError(f"Checkpoint file {path} is corrupted: it is not an accel manifest.")
    for key in ("files", "rng_files", "strategy_files"):
        names = manifest.get(key, [])
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise CheckpointError(
                f"Checkpoint file {path} is corrupted: its {key!r} entry must be a list of file names, got "
                f"{type(names).__name__}. Load an earlier checkpoint."
            )
    hashes = manifest.get("sha256", {})
    if not (isinstance(hashes, dict) and all(isinstance(v, str) and DIGEST_RE.fullmatch(v) for v in hashes.values())):
        raise CheckpointError(
            f"Checkpoint file {path} is corrupted: its 'sha256' entry must map file names to SHA-256 hex digests, "
            f"got {_describe(hashes)}. Load an earlier checkpoint."
        )
    names = [*hashes, *manifest.get("files", []), *manifest.get("rng_files", []), *manifest.get("strategy_files", [])]
    escaping = next((n for n in names if not safe_name(n)), None)
    if escaping is not None:
        raise CheckpointError(
            f"Checkpoint file {path} is corrupted: it names {escaping[:200]!r}, which is not a file inside the "
            "checkpoint (absolute, or with '..'). Nothing was read from it; load an earlier checkpoint."
        )
    return manifest


def _describe(hashes: Any) -> str:
    if isinstance(hashes, dict):
        bad = next((k, v) for k, v in hashes.items() if not (isinstance(v, str) and DIGEST_RE.fullmatch(v)))
        return f"{bad[0]!r}: {str(bad[1])[:80]!r}"
    return type(hashes).__name__


def locate(directory: str | os.PathLike[str]) -> Located | None:
    """The complete checkpoint at `directory`, or None. Reads only; never moves anything.

    Raises:
        CheckpointError: the manifest exists but is damaged (naming it).
    """
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        manifest = _read_manifest(directory / MANIFEST)
        return Located(directory, manifest, hashes=dict(manifest.get("sha256", {})))
    staged = directory / STAGING
    if (staged / MANIFEST).is_file():
        manifest = _read_manifest(staged / MANIFEST)
        return Located(directory, manifest, staged=staged, hashes=dict(manifest.get("sha256", {})))
    old = _sibling(directory, OLD_SUFFIX)
    if not directory.exists() and (old / MANIFEST).is_file():
        manifest = _read_manifest(old / MANIFEST)
        return Located(old, manifest, hashes=dict(manifest.get("sha256", {})))
    return None


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """Whether `directory` holds a checkpoint that finished writing."""
    try:
        return locate(directory) is not None
    except CheckpointError:
        return False


def _sibling(directory: Path, suffix: str) -> Path:
    """`<directory><suffix>` beside it (absolute, so that "." has a name)."""
    directory = directory.absolute()
    return directory.with_name(directory.name + suffix)


# ---- the writer's side ------------------------------------------------------------------------
def make_directory(final: Path) -> None:
    """Create `final` for a save (putting back `<final>.accel-old`, the old layout's crash leftover, if complete).

    Raises:
        CheckpointError: `final` exists and is not a directory.
    """
    if final.exists() and not final.is_dir():
        raise CheckpointError(
            f"save_state needs a directory, but {final} is a file. Choose another output_dir, or move the file."
        )
    old = _sibling(final, OLD_SUFFIX)
    if not final.exists() and (old / MANIFEST).is_file():
        os.replace(old, final)
    elif (old / MANIFEST).is_file():
        warnings.warn(
            f"Kept {old}: a complete checkpoint beside {final}, left by an accel release before in-place saves (or "
            "copied there). accel no longer removes it; delete it once you no longer need it.",
            UserWarning,
            stacklevel=7,
        )
    final.mkdir(parents=True, exist_ok=True)


def begin(final: Path) -> Path:
    """Finish a commit a crash interrupted, clear accel's debris, and return a new, empty staging directory.

    Call with the directory's save lock and files lock held (`accel.checkpoint.lock`).

    Raises:
        CheckpointError: a folder of a name accel uses for staging is in the way, and is not accel's.
    """
    recover(final, strict=True)
    staging = final / STAGING
    _make_own(staging)
    return staging


def interrupted(final: Path) -> bool:
    """Whether `final` holds a commit a crash interrupted (a complete staging directory, no manifest)."""
    return not (final / MANIFEST).is_file() and (final / STAGING / MANIFEST).is_file()


def recover(final: Path, *, strict: bool = False) -> None:
    """Finish an interrupted commit (a complete staging directory), then remove accel's debris.

    A staging or replaced directory without accel's marker is left alone; with `strict` (a save,
    which needs the name) it raises a `CheckpointError` naming it. Call holding the files lock.
    """
    staging = final / STAGING
    if interrupted(final) and ours(staging):
        _move_up(staging, final, _read_manifest(staging / MANIFEST))
    for debris in (staging, final / REPLACED):
        if not os.path.lexists(debris):
            continue
        if ours(debris):
            remove_entry(debris)
        elif strict:
            raise CheckpointError(
                f"save_state cannot use {final}: {debris} is in the way. accel keeps its staging files under that "
                f"name, and this one is not accel's (it has no {MARKER} marker). Nothing was changed; move or "
                "rename it (delete it if it is debris of a save by an earlier accel release), then save again."
            )


def _previous(final: Path) -> dict[str, Any]:
    if not (final / MANIFEST).is_file():
        return {}
    try:
        return _read_manifest(final / MANIFEST)
    except CheckpointError:
        # A damaged manifest lists nothing: every same-named file counts as the user's below.
        return {}


def seal(staging: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Check the staged checkpoint may replace what is in `final`, then write its manifest: it is complete.

    A file of the new checkpoint's name that no accel manifest in `final` lists is replaced only
    when it holds a checkpoint of that kind (as Accelerate's `save_state` writes them, or accel's
    own files after a lost manifest), with a warning naming it; anything else makes the save fail.

    Raises:
        CheckpointError: a file of the new checkpoint would overwrite a file that is not a checkpoint file.
    """
    theirs = set(owned_names(_previous(final)))
    clashing = sorted(n for n in owned_names(manifest) if (final / n).exists() and n not in theirs)
    foreign = [n for n in clashing if not holds_a_checkpoint(final / n)]
    if foreign:
        raise CheckpointError(
            f"save_state would overwrite {', '.join(foreign)} in {final}, which accel did not write (no accel "
            "manifest there lists them, and they do not hold a checkpoint). Nothing was changed; move those files "
            "or choose another output_dir."
        )
    if clashing:
        others = sorted(p.name for p in final.iterdir() if _ACCELERATE_ONLY_RE.fullmatch(p.name))
        kept = f" Kept as they are, and not part of the new checkpoint: {', '.join(others)}." if others else ""
        warnings.warn(
            f"save_state is replacing {', '.join(clashing)} in {final}: checkpoint files that no accel manifest "
            f"lists (an Accelerate checkpoint, or an accel one whose manifest was lost). Every other file there is "
            f"kept.{kept}",
            UserWarning,
            stacklevel=6,
        )
    save_json(manifest, staging / MANIFEST)


def holds_a_checkpoint(path: Path) -> bool:
    """Whether `path`, named like a file accel writes into a checkpoint, holds a checkpoint of that kind.

    Only headers and archive directories are read: a safetensors header, a `torch.save` zip
    archive (`.bin`, `.pt`), loader positions (`dataloaders.json`), a sharded checkpoint's
    `.metadata` or DeepSpeed's `*model_states.pt`. Nothing is unpickled.
    """
    name = path.name
    if path.is_dir():
        if name == "pytorch_model":
            return any(path.glob("*model_states.pt"))
        return bool(_CHECKPOINT_DIR_RE.fullmatch(name)) and (path / ".metadata").is_file()
    if not (path.is_file() and _CHECKPOINT_FILE_RE.fullmatch(name)):
        return False
    try:
        if name.endswith(".safetensors"):
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if not 2 <= size <= min(path.stat().st_size - 8, 100_000_000):
                    return False
                return isinstance(json.loads(f.read(size)), dict)
        if name.endswith(".json"):
            states = json.loads(path.read_bytes())
            return isinstance(states, list) and all(isinstance(s, dict) and "epoch" in s for s in states)
        with zipfile.ZipFile(path) as archive:
            return any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist())
    except (OSError, ValueError, zipfile.BadZipFile):
        return False


def commit(staging: Path, final: Path) -> None:
    """Replace the previous checkpoint's files in `final` with the sealed staged checkpoint's."""
    replaced = final / REPLACED
    _make_own(replaced)
    if (final / MANIFEST).is_file():
        # The manifest goes first: from here until the new one arrives, the staged checkpoint
        # (complete) is the one a load finds.
        os.replace(final / MANIFEST, replaced / MANIFEST)
    # The previous checkpoint's files, and the unlisted checkpoint files `seal` accepted.
    new = _read_manifest(staging / MANIFEST)
    for name in dict.fromkeys([*owned_names(_previous(replaced)), *owned_names(new)]):
        if os.path.lexists(final / name):
            os.replace(final / name, replaced / name)
    _move_up(staging, final, new)
    shutil.rmtree(replaced)
    shutil.rmtree(staging)


def _move_up(staging: Path, final: Path, manifest: dict[str, Any]) -> None:
    for name in owned_names(manifest):
        if os.path.lexists(staging / name):
            if (final / name).is_dir() and not (final / name).is_symlink():
                shutil.rmtree(final / name)
            os.replace(staging / name, final / name)
    os.replace(staging / MANIFEST, final / MANIFEST)


def new_manifest(files: list[str], rng_files: list[str], hashes: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The manifest of a checkpoint: its files, every file's digest, and `extra` (step, processes).

    The digests keep the key `sha256` they had when they were all SHA-256; each names its algorithm
    (`accel.checkpoint.digest`)."""
    return {"format": FORMAT_VERSION, **extra, "files": files, "rng_files": rng_files, "sha256": hashes}


def remove_entry(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a directory tree (whose links rmtree never follows)."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def _make_own(path: Path) -> None:
    path.mkdir()
    (path / MARKER).write_text("made by accel: a save's staging directory, removed when the save ends\n")


def ours(path: Path) -> bool:
    """Whether `path` is a directory accel made here (its marker, a finished staging's manifest, or empty)."""
    if path.is_symlink() or not path.is_dir():
        return False
    return (path / MARKER).is_file() or (path / MANIFEST).is_file() or not any(path.iterdir())
