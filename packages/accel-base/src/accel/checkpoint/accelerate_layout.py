"""Checkpoints written by Hugging Face Accelerate 1.15's `save_state`, read by accel's `load_state`.

Accelerate writes (one process, DDP, FSDP2):

- weights: `model.safetensors` / `model_<i>.safetensors`, or `pytorch_model.bin` / `pytorch_model_<i>.bin`
  (`safe_serialization=False`); FSDP full state dict: `pytorch_model_fsdp.bin` / `pytorch_model_fsdp_<i>.bin`;
  FSDP sharded: `pytorch_model_fsdp_<i>/` (a torch.distributed.checkpoint folder, accel's own name);
- optimizers: `optimizer.bin` / `optimizer_<i>.bin` (FSDP full: keyed by parameter name), sharded `optimizer_<i>/`;
- `scheduler.bin` / `scheduler_<i>.bin`, `scaler.pt`, `custom_checkpoint_<i>.pkl` (all `torch.save` archives);
- `random_states_<rank>.pkl` per process: a `torch.save` archive of a dict with the step, Python's,
  NumPy's and torch's generator states (and each device's, under `torch_<device type>_manual_seed`).

Nothing is unpickled without restriction. The random states and registered objects are read by torch's
weights-only unpickler admitting, beyond tensors and plain containers, exactly NumPy's array
reconstruction: `numpy._core.multiarray._reconstruct` (also under its NumPy 1 name
`numpy.core.multiarray._reconstruct`), `numpy.ndarray`, `numpy.dtype` and the dtype classes of NumPy's
boolean, integer, floating and complex types. Every other file is read as accel reads its own.

`locate` translates such a directory into an accel checkpoint: a scratch directory holding a manifest,
this process's random states in accel's form, and links under accel's file names to Accelerate's files
(a strategy's loader reads those); `Located.path` names Accelerate's own files, so an error names the
file the user has. The scratch directory is removed when the load is over.

DeepSpeed (`engine.save_checkpoint(output_dir, "pytorch_model")`): the tag folder `pytorch_model/`
(`pytorch_model_<i>/`) is linked under its own name and listed as a strategy folder, which accel's
DeepSpeed strategy loads (it tags its engines the same way) and every other strategy refuses by name.

Not read (refused by name, nothing loaded): per-rank FSDP files (`*_rank<r>.bin`: FSDP1's local state dict or
`use_dcp=False`), a pickled sampler (`sampler.bin`) and torchdata loader positions (`dl_state_dict.bin`).
"""

from __future__ import annotations

import pickle
import re
import shutil
import tempfile
import warnings
import weakref
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointError
from .dcp import SHARDED_NAME
from .io import save_json, save_torch
from .layout import FORMAT_VERSION, MANIFEST, Located
from .layout import locate as locate_accel

RNG_FILE = re.compile(r"random_states_(\d+)\.pkl")
_PER_RANK = re.compile(r"(?:pytorch_model_fsdp|optimizer)(?:_\d+)?_rank\d+\.bin")
_LOADER_FILES = re.compile(r"(?:sampler|dl_state_dict)(?:_\d+)?\.bin")
_INDEXED = re.compile(
    r"(?P<stem>model|pytorch_model|pytorch_model_fsdp|optimizer|scheduler)(?:_(?P<i>\d+))?\.(?P<ext>safetensors|bin)"
)
_CUSTOM = re.compile(r"custom_checkpoint_(\d+)\.pkl")
# `engine.save_checkpoint(output_dir, tag)` with Accelerate's tags: `pytorch_model`, `pytorch_model_<i>`.
_DEEPSPEED_TAG = re.compile(r"pytorch_model(?:_\d+)?")


@dataclass(frozen=True)
class AccelerateCheckpoint(Located):
    """An Accelerate checkpoint seen as an accel one: `directory` is the scratch translation, `path` the originals."""

    source: Path = Path()
    names: dict[str, Path] = field(default_factory=dict)

    def path(self, name: str) -> Path:
        """Accelerate's file for accel's name `name` (this process's random states: their translation)."""
        return self.names.get(name, self.source / name)


def is_accelerate_checkpoint(directory: Path) -> bool:
    """Whether `directory` holds what Accelerate's `save_state` writes (it always writes `random_states_<rank>.pkl`)."""
    return directory.is_dir() and any(RNG_FILE.fullmatch(p.name) for p in directory.iterdir())


def locate(directory: Path, rank: int, device: torch.device, *, announce: bool) -> AccelerateCheckpoint:
    """The Accelerate checkpoint at `directory`, translated for this process (`rank`, on `device`).

    `announce`: warn once (the main process) that its files load unverified (Accelerate records no hashes).

    Raises:
        CheckpointError: a layout accel cannot read, or a random-state file that is damaged or holds a
            type Accelerate never writes there (naming the file and the type).
    """
    _refuse_unreadable(directory)
    names: dict[str, Path] = {}
    folders: list[str] = []
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if entry.is_dir() and SHARDED_NAME.fullmatch(name) and (entry / ".metadata").is_file():
            names[name] = entry
            folders.append(name)
        elif entry.is_dir() and _DEEPSPEED_TAG.fullmatch(name) and any(entry.glob("*model_states.pt")):
            # DeepSpeed's engine checkpoint under the tag accel's DeepSpeed strategy loads too.
            names[name] = entry
            folders.append(name)
        elif entry.is_file() and (accel_name := _accel_name(name)) is not None:
            names.setdefault(accel_name, entry)
    rng_files = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := RNG_FILE.fullmatch(p.name)))
    mine = dict(rng_files).get(rank)
    states = read_pickle(mine, "random states") if mine is not None else None
    if mine is None:  # saved by fewer processes: Accelerate's own load_state skips them too (and logs it)
        warnings.warn(
            f"Checkpoint {directory} holds no random states for process {rank} (random_states_{rank}.pkl; it was "
            f"saved by {len(rng_files)} processes): this process's generators are not restored.",
            UserWarning,
            stacklevel=7,
        )
    step = _step(states if states is not None else read_pickle(rng_files[0][1], "random states"))

    scratch = Path(tempfile.mkdtemp(prefix="accel-from-accelerate-"))
    try:
        for name, original in names.items():
            (scratch / name).symlink_to(original.absolute(), target_is_directory=original.is_dir())
        if states is not None:
            rng = f"random_states_{rank}.pt"
            save_torch(rng_state(states, mine, device), scratch / rng)  # type: ignore[arg-type]
            names[rng] = scratch / rng
        manifest = {
            "format": FORMAT_VERSION,
            "written_by": "accelerate",
            "step": step,
            "num_processes": len(rng_files),
            "files": [],
            "rng_files": [],
            "sha256": {},
            "strategy_files": folders,
        }
        save_json(manifest, scratch / MANIFEST)
        plain = locate_accel(scratch)
        assert plain is not None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    found = AccelerateCheckpoint(scratch, plain.manifest, source=directory, names=names)
    weakref.finalize(found, shutil.rmtree, scratch, True)
    if announce:
        warnings.warn(
            f"Checkpoint {directory} was written by Accelerate, which records no hashes: its files load unverified. "
            "Saving it again with save_state writes an accel checkpoint with a SHA-256 for every file.",
            UserWarning,
            stacklevel=7,  # the caller of Accelerator.load_state
        )
    return found


def _accel_name(name: str) -> str | None:
    """accel's name for Accelerate's file `name` (None: not one accel reads)."""
    if m := _CUSTOM.fullmatch(name):
        return f"custom_checkpoint_{m.group(1)}.bin"
    if name == "scaler.pt":
        return name
    m = _INDEXED.fullmatch(name)
    if m is None:
        return None
    stem, i, ext = m.group("stem"), m.group("i"), m.group("ext")
    suffix = f"_{i}" if i is not None else ""
    if stem in ("pytorch_model", "pytorch_model_fsdp"):
        return f"model{suffix}.bin" if ext == "bin" else None
    return f"{stem}{suffix}.{ext}"


def _refuse_unreadable(directory: Path) -> None:
    per_rank = sorted(p.name for p in directory.iterdir() if _PER_RANK.fullmatch(p.name))
    if per_rank:
        raise CheckpointError(
            f"Checkpoint {directory} was written by Accelerate as one file per process ({per_rank[0]}: FSDP's local "
            "state dict, or a sharded state dict saved without torch.distributed.checkpoint), which accel does not "
            "read. Nothing was loaded: save it under Accelerate with state_dict_type FULL_STATE_DICT, or "
            "SHARDED_STATE_DICT with its default torch.distributed.checkpoint folders."
        )
    loaders = sorted(p.name for p in directory.iterdir() if _LOADER_FILES.fullmatch(p.name))
    if loaders:
        raise CheckpointError(
            f"Checkpoint {directory} holds Accelerate's position of a data loader ({loaders[0]}: a pickled sampler "
            "or a torchdata StatefulDataLoader state), which accel cannot translate into its own loader position. "
            "Nothing was loaded: move that file out of the directory to load the rest, and position the loader "
            "with accelerator.skip_first_batches."
        )


def _step(states: Any) -> int:
    step = states.get("step", 0) if isinstance(states, dict) else 0
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


def rng_state(states: Any, path: Path, device: torch.device) -> dict[str, Any]:
    """Accelerate's random states (`random_states_<rank>.pkl`) in the form accel's adapters restore.

    Raises:
        CheckpointError: (naming the file) an entry is missing or of another form.
    """
    try:
        python, numpy_state, cpu = states["random_state"], states["numpy_random_seed"], states["torch_manual_seed"]
        kind, keys, pos, has_gauss, cached = numpy_state
        if not (isinstance(python, tuple) and isinstance(cpu, torch.Tensor) and isinstance(keys, np.ndarray)):
            raise TypeError("an entry of another type")
        numpy_part = {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(
            f"Checkpoint file {path} does not hold Accelerate's random states ({type(exc).__name__}: {exc}). "
            "Nothing was loaded."
        ) from exc
    # Accelerate saves every device's generator (`get_rng_state_all`); this process restores its own device's.
    per_device = states.get(f"torch_{device.type}_manual_seed")
    index = device.index or 0
    on_device = per_device[index] if isinstance(per_device, (list, tuple)) and index < len(per_device) else None
    return {"python": python, "numpy": numpy_part, "torch": cpu, "device": on_device}


# ---- the restricted reader --------------------------------------------------------------------
def _numpy_globals() -> list[Any]:
    """NumPy's array reconstruction, as pickled by NumPy 2 and by NumPy 1 (`numpy.core`)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    codes = ["?", "b", "h", "i", "l", "q", "B", "H", "I", "L", "Q", "e", "f", "d", "g", "F", "D", "G"]
    dtype_classes = list(dict.fromkeys(type(np.dtype(code)) for code in codes))
    return [
        (_reconstruct, "numpy._core.multiarray._reconstruct"),
        (_reconstruct, "numpy.core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        *dtype_classes,
    ]


_REFUSED = re.compile(r"(?:GLOBAL|global) ([\w.]+)|but got <class '([\w.]+)'>")


def read_pickle(path: Path, what: str) -> Any:
    """A `torch.save` archive Accelerate wrote, read by torch's weights-only unpickler admitting NumPy arrays.

    Raises:
        CheckpointError: (one line, naming the file) not a `torch.save` archive, damaged, or it references a
            type beyond tensors, plain containers and NumPy arrays (named); nothing in it ran.
    """
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"Checkpoint file {path} is not a torch.save archive, so it is not Accelerate's {what}. Nothing was loaded."
        )
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _REFUSED.search(str(exc))
        if found is None:
            raise CheckpointError(
                f"Checkpoint file {path} could not be read as Accelerate's {what}: it is truncated or corrupted. "
                "Nothing was loaded."
            ) from exc
        refused = found.group(1) or found.group(2)
        raise CheckpointError(
            f"Checkpoint file {path} references {refused}, a type Accelerate never writes in its {what}, which could "
            "run code to rebuild; nothing in it ran and nothing was loaded."
        ) from exc
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"Checkpoint file {path} could not be read as Accelerate's {what} ({type(exc).__name__}); it is "
            "truncated or corrupted. Nothing was loaded."
        ) from exc
