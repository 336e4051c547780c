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

Data loader positions become accel's (`dataloaders.json` in the scratch directory), for loader `i` (files
`dl_state_dict.bin`/`sampler.bin` for 0, `dl_state_dict_<i>.bin`/`sampler_<i>.bin` after):

- `dl_state_dict_<i>.bin` (`use_stateful_dataloader=True`: torchdata's `StatefulDataLoader` state, read with
  the restricted reader): the batches this process's loader had yielded in its epoch
  (`_sampler_iter_yielded`, which Accelerate corrects for its look-ahead), 0 once the iterator finished.
  Accelerate keeps no epoch there, so the live loader's epoch stays, as under Accelerate's own resume; a
  stateful accel loader then skips those batches (one that is not stateful starts the epoch over, as
  Accelerate's does). States holding more than a position (worker snapshots of `num_workers > 0`, a
  stateful sampler's or dataset's own state) are refused by name.
- `sampler_<i>.bin` (a pickled `SeedableRandomSampler`, its dataset included): read without unpickling
  anything (`_inert_pickle`: every class and function in it stays a name), for its `initial_seed` and
  `epoch`, which become the position's seed and epoch.

Not read (refused by name, nothing loaded): per-rank FSDP files (`*_rank<r>.bin`: FSDP1's local state dict or
`use_dcp=False`).
"""

from __future__ import annotations

import pickle
import re
import shutil
import tempfile
import warnings
import weakref
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from ..errors import CheckpointError
from .dcp import SHARDED_NAME
from .io import save_json, save_torch
from .layout import FORMAT_VERSION, MANIFEST, Located
from .layout import locate as locate_accel

RNG_FILE = re.compile(r"random_states_(\d+)\.pkl")
_PER_RANK = re.compile(r"(?:pytorch_model_fsdp|optimizer)(?:_\d+)?_rank\d+\.bin")
_LOADER_STATE = re.compile(r"dl_state_dict(?:_(\d+))?\.bin")
_SAMPLER = re.compile(r"sampler(?:_(\d+))?\.bin")
_SAMPLER_CLASS = "accelerate.data_loader.SeedableRandomSampler"
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


def locate(
    directory: Path, rank: int, device: torch.device, *, announce: bool, loader_epochs: Sequence[int] = ()
) -> AccelerateCheckpoint:
    """The Accelerate checkpoint at `directory`, translated for this process (`rank`, on `device`).

    `announce`: warn once (the main process) that its files load unverified (Accelerate records no hashes).
    `loader_epochs`: the live prepared loaders' epochs (a position Accelerate saved holds none).

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
    positions = loader_positions(directory, loader_epochs)

    scratch = Path(tempfile.mkdtemp(prefix="accel-from-accelerate-"))
    try:
        for name, original in names.items():
            (scratch / name).symlink_to(original.absolute(), target_is_directory=original.is_dir())
        if states is not None:
            rng = f"random_states_{rank}.pt"
            save_torch(rng_state(states, mine, device), scratch / rng)  # type: ignore[arg-type]
            names[rng] = scratch / rng
        if positions:
            save_json(positions, scratch / "dataloaders.json")
            names["dataloaders.json"] = scratch / "dataloaders.json"
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
            "Saving it again with save_state writes an accel checkpoint with a digest of every file.",
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


# ---- data loader positions --------------------------------------------------------------------
def loader_positions(directory: Path, loader_epochs: Sequence[int]) -> list[dict[str, Any]]:
    """accel's positions (`dataloaders.json`) for the loaders Accelerate saved a state or sampler of.

    One per loader up to the last file's index; a loader without a file keeps its place (its live
    epoch, nothing skipped), as Accelerate's `load_state` leaves it.

    Raises:
        CheckpointError: (naming the file) a state that holds more than a position, or that is not one.
    """
    found: dict[int, dict[str, Path]] = {}
    for entry in directory.iterdir():
        for kind, pattern in (("state", _LOADER_STATE), ("sampler", _SAMPLER)):
            if entry.is_file() and (m := pattern.fullmatch(entry.name)):
                found.setdefault(int(m.group(1) or 0), {})[kind] = entry
    if not found:
        return []
    positions = []
    for i in range(max(found) + 1):
        epoch = loader_epochs[i] if i < len(loader_epochs) else 0
        position: dict[str, Any] = {"epoch": int(epoch), "batches_yielded": 0, "seed": None}
        files = found.get(i, {})
        if "sampler" in files:
            position["seed"], position["epoch"] = _sampler_seed_and_epoch(files["sampler"])
        if "state" in files:
            position["batches_yielded"] = _batches_yielded(
                read_pickle(files["state"], "data loader state"), files["state"]
            )
        positions.append(position)
    return positions


def _batches_yielded(state: Any, path: Path) -> int:
    """The batches a `StatefulDataLoader` state says its process had yielded in the epoch (0: finished)."""
    if not isinstance(state, dict):
        raise CheckpointError(
            f"Checkpoint file {path} does not hold a StatefulDataLoader state (got {type(state).__name__}). "
            "Nothing was loaded."
        )
    if "_snapshot" in state:
        snapshot = state["_snapshot"] if isinstance(state["_snapshot"], dict) else {}
        step, since = snapshot.get("_snapshot_step"), state.get("_steps_since_snapshot")
        count = step + since if _is_count(step) and _is_count(since) else None
        skip = f"accelerator.skip_first_batches(loader, {count})" if count is not None else "skip_first_batches"
        raise CheckpointError(
            f"Checkpoint file {path} holds a StatefulDataLoader state saved with worker processes (num_workers > 0: "
            "the workers' own snapshots), which accel does not translate into its loader position. Nothing was "
            f"loaded: move that file out of the directory to load the rest, and position the loader with {skip}."
        )
    held = [
        key
        for key in ("_index_sampler_state", "_sampler_iter_state", "dataset_state", "fetcher_state")
        if state.get(key) is not None
    ]
    if held:
        raise CheckpointError(
            f"Checkpoint file {path} holds {held[0]} (the state of a stateful sampler or dataset), which accel's loader "
            "cannot take: it restores a position, not the state of your sampler or dataset. Nothing was loaded: move "
            "that file out of the directory to load the rest, and position the loader with "
            "accelerator.skip_first_batches."
        )
    if state.get("_iterator_finished") is True:
        return 0
    count = state.get("_sampler_iter_yielded", state.get("_num_yielded"))
    if not _is_count(count):
        raise CheckpointError(
            f"Checkpoint file {path} does not hold a StatefulDataLoader position (_sampler_iter_yielded: {count!r}). "
            "Nothing was loaded."
        )
    return int(count)


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sampler_seed_and_epoch(path: Path) -> tuple[int, int]:
    """`initial_seed` and `epoch` of the `SeedableRandomSampler` pickled in `path`, nothing in it unpickled."""
    sampler = _inert_pickle(path)
    state = sampler.state if isinstance(sampler, _Inert) else None
    seed, epoch = (state.get("initial_seed"), state.get("epoch")) if isinstance(state, dict) else (None, None)
    if not (isinstance(sampler, _Inert) and sampler.name == _SAMPLER_CLASS and _is_count(seed) and _is_count(epoch)):
        got = sampler.name if isinstance(sampler, _Inert) else type(sampler).__name__
        raise CheckpointError(
            f"Checkpoint file {path} does not hold Accelerate's SeedableRandomSampler with an initial_seed and an "
            f"epoch (got {got}). Nothing was loaded."
        )
    return int(seed), int(epoch)


class _Inert:
    """Stands for an object of any class in a pickle read by `_inert_pickle`: its name, arguments and state.

    Each class or function the pickle names becomes a subclass of this one carrying the name; building
    one records what it was given and runs nothing of the real class.
    """

    name = ""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any
    items: list[Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        obj = super().__new__(cls)
        obj.args, obj.kwargs, obj.state, obj.items = args, kwargs, None, []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> type:
        return type(name, (_Inert,), {"name": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Any:
        return None  # a tensor's storage: not read


def _inert_pickle(path: Path) -> Any:
    """The object a `torch.save` archive holds, every class and function in it replaced by an `_Inert`.

    Raises:
        CheckpointError: (naming the file) not a `torch.save` archive, or damaged.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            data = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(data) != 1:
                raise zipfile.BadZipFile("no data.pkl")
            with archive.open(data[0]) as stream:
                return _InertUnpickler(stream).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, IndexError) as exc:
        raise CheckpointError(
            f"Checkpoint file {path} could not be read as Accelerate's pickled sampler ({type(exc).__name__}): it is "
            "not a torch.save archive, or it is truncated or corrupted. Nothing was loaded."
        ) from exc


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
