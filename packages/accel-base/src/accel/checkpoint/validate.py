"""Reading a checkpoint for `load_state`, and the checks that it fits the live objects, before anything is applied.

`torch.nn.Module.load_state_dict` copies every matching tensor before it reports a missing
key or a wrong shape, and `Optimizer.load_state_dict` accepts state tensors of any shape:
both would leave the live objects half-overwritten or silently wrong. These checks raise a
`CheckpointError` naming the file first, so a failed `load_state` changes nothing.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CheckpointError
from ..prepare.wrappers import unwrap_through
from .dcp import SHARDED_NAME, model_folder, optimizer_folder, read_full
from .io import (
    MappedWeights,
    SharedHashing,
    hash_file,
    load_json,
    load_safetensors,
    load_torch,
    map_safetensors,
    mismatch,
)
from .layout import Located, file_name
from .optimizer_keys import parameter_names, rekey

if TYPE_CHECKING:
    from ..prepare.prepared import Prepared, RunContext

# The files of the default layout, which a full-state-dict FSDP2 save writes too.
_DEFAULT_NAME = re.compile(r"(model|optimizer)(_\d+)?\.(safetensors|bin)")


def read_and_check(
    prepared: Prepared,
    ctx: RunContext,
    found: Located,
    strict: bool,
    custom: list[str],
    mapped: list[MappedWeights] | None = None,
    share: SharedHashing | None = None,
) -> dict[str, Any]:
    """Every file this rank needs, read and verified, and checked against the live objects.

    Returns the plan ``accel.checkpoint` applies: each entry keeps the file
    it came from, so that an error while applying still names it.

    `mapped`: where the strategy loads a full state dict with `Module.load_state_dict` (which copies),
    the models' safetensors files are read in place under a read lease (`map_safetensors`) and each
    `MappedWeights` is added here; the caller releases them once the models are loaded.

    `share`: where the processes of a node read the same files, this process hashes only its chunks of
    each file they all read (`SharedHashing`); the caller checks the digests once all have (`check_shared`).
    """
    plan: dict[str, Any] = {"models": [], "optimizers": [], "objects": []}
    rank, world = ctx.process_index, ctx.num_processes
    # A strategy that restores models and optimizers itself (FSDP2, DeepSpeed) reads them in its loader.
    default_reader = not ctx.strategy.loads_checkpoint_models(prepared)
    # Files a strategy reads itself are verified here, each by one rank (they can be large);
    # every one is first checked to be a regular file inside the checkpoint, on every rank. Full
    # weights and optimizer files the default reader below reads are verified as it reads them.
    names = sorted(
        n for n in found.hashes if n.split("/")[0] in custom and not (default_reader and _DEFAULT_NAME.fullmatch(n))
    )
    paths = [found.path(name) for name in names]
    for i, (name, path) in enumerate(zip(names, paths)):
        if i % world == rank and hash_file(path, found.hashes[name]) != found.hashes[name]:
            raise mismatch(found.path(name), found.hashes[name])

    def torch_file(name: str, **kw: Any) -> Any:
        return load_torch(found.path(name), sha256=found.sha256(name), share=share, **kw)

    if default_reader:
        refuse_foreign_files(found, custom, type(ctx.strategy).__name__)
        modules = [unwrap_through(model, ctx.strategy) for model in prepared.models]
        for i, (model, module) in enumerate(zip(prepared.models, modules)):
            # Any layout's weights come out whole: a sharded folder is read in full by this process.
            if model_folder(i) in custom:
                path = found.path(model_folder(i))
                sd = read_sharded(path, "model")
            elif found.path(file_name("model", i, "safetensors")).is_file():
                path = found.path(file_name("model", i, "safetensors"))
                lease = map_safetensors(path, found.sha256(path.name), share) if mapped is not None else None
                if lease is not None:
                    mapped.append(lease)  # type: ignore[union-attr]  # not None when a lease was taken
                    sd = lease.tensors  # verified below, while the files after it are read
                else:
                    sd = load_safetensors(path, sha256=found.sha256(path.name))
                    if share is not None and share.takes(found.sha256(path.name)):
                        share.hash_part(path, str(found.sha256(path.name)))  # the node's check counts on this part
            else:
                path = found.path(file_name("model", i, "bin"))
                sd = torch_file(path.name)
            check_model_state(module.state_dict(), sd, path, strict=strict)
            plan["models"].append((model, sd))
        location = "cpu" if ctx.adapter.checkpoint_on_host else ctx.device
        for i, opt in enumerate(prepared.optimizers):
            inner = getattr(opt, "optimizer", opt)
            if optimizer_folder(i) in custom:
                path = found.path(optimizer_folder(i))
                saved = read_sharded(path, "optimizer")
            else:
                path = found.path(file_name("optimizer", i, "bin"))
                saved = torch_file(path.name, map_location=location)
            # A sharded run saved the state keyed by parameter name; this run's optimizer numbers them.
            sd = rekey(saved, inner, parameter_names(inner, modules), by_name=False, path=path)
            check_optimizer_state(inner, sd, path)
            plan["optimizers"].append((opt, sd, path))
    from_accelerate = found.manifest.get("written_by") == "accelerate"
    for i, sched in enumerate(prepared.schedulers):
        name = file_name("scheduler", i, "bin")
        if from_accelerate and in_engine_checkpoint(sched) and not found.path(name).is_file():
            continue  # Accelerate saves such a scheduler only in the engine's checkpoint: the strategy restores it
        state = torch_file(name)
        check_mapping(state, found.path(name), "scheduler")
        plan["objects"].append((sched, state, found.path(name), "scheduler"))
    if prepared.scaler is not None:
        state = torch_file("scaler.pt")
        check_scaler_state(state, prepared.scaler.state_dict(), found.path("scaler.pt"))
        plan["objects"].append((prepared.scaler, state, found.path("scaler.pt"), "grad scaler"))
    if found.path("dataloaders.json").is_file() or "dataloaders.json" in found.hashes:
        path = found.path("dataloaders.json")
        states = load_json(path, sha256=found.sha256("dataloaders.json"))
        check_loader_states(states, path, prepared.dataloaders)
        plan["objects"] += [(dl, st, path, "data loader") for dl, st in zip(prepared.dataloaders, states)]
    for i, obj in enumerate(prepared.custom_objects):
        name = f"custom_checkpoint_{i}.bin"
        plan["objects"].append((obj, torch_file(name), found.path(name), "registered object"))
    rng = f"random_states_{ctx.process_index}.pt"
    plan["rng"] = None
    if found.path(rng).is_file() or rng in found.hashes:
        # Each process's own file: hashed whole by the process that reads it.
        plan["rng"] = (load_torch(found.path(rng), sha256=found.sha256(rng)), found.path(rng))
        check_rng_state(plan["rng"][0], ctx.adapter.get_rng_state(), found.path(rng))
    for lease in mapped or []:
        lease.verify()
    return plan


def refuse_foreign_files(found: Located, custom: list[str], strategy: str) -> None:
    """Raise unless every file a strategy wrote for itself is one any run reads (full or sharded weights)."""
    foreign = [n for n in custom if not (_DEFAULT_NAME.fullmatch(n) or SHARDED_NAME.fullmatch(n))]
    if foreign:
        raise CheckpointError(
            f"Checkpoint {getattr(found, 'source', found.directory)} holds its models and optimizers in files the "
            "strategy that saved it "
            f"wrote its own way ({', '.join(foreign[:4])}), which this run's {strategy} cannot read. Nothing was "
            "loaded: load it under the strategy that saved it (accel merge-weights turns its weights into a file)."
        )


def read_sharded(folder: Path, kind: str) -> Any:
    """The whole `kind` ("model" or "optimizer") of a sharded folder, read by this process alone."""
    if not folder.is_dir():
        raise CheckpointError(f"Checkpoint folder {folder} is missing. Nothing was loaded. Load an earlier checkpoint.")
    state = read_full(folder)
    if kind not in state:
        raise CheckpointError(
            f"Sharded checkpoint {folder} holds no {kind} state ({_brief(state)}). Nothing was loaded."
        )
    return state[kind]


def warn_if_unverified(found: Located) -> None:
    """Once per load: which files have no recorded digest, and so load unverified."""
    listed = [*found.manifest.get("files", []), *found.manifest.get("rng_files", [])]
    hashed = set(found.hashes)
    bare = [n for n in listed if n not in hashed and not any(h.startswith(n + "/") for h in hashed)]
    if not bare:
        return
    if "sha256" not in found.manifest and found.manifest.get("format", 1) == 1:
        why = "it was written by an accel release that recorded no hashes"
    else:
        why = f"its manifest records none for {', '.join(bare[:6])}{' and others' if len(bare) > 6 else ''}"
    warnings.warn(
        f"Checkpoint {found.directory} is unverified: {why}, so a corrupted or changed file may load silently. "
        "Saving it again with save_state records a digest for every file.",
        UserWarning,
        stacklevel=4,
    )


def check_model_state(live: dict[str, Any], loaded: dict[str, Any], path: Path, *, strict: bool) -> None:
    """`loaded` has every key of `live` (when `strict`), no others, and each tensor's shape."""
    if strict:
        missing = sorted(set(live) - set(loaded))
        unexpected = sorted(set(loaded) - set(live))
        if missing or unexpected:
            raise CheckpointError(
                f"Checkpoint file {path} does not fit the model: missing keys {_few(missing)}, unexpected keys "
                f"{_few(unexpected)}. Nothing was loaded. Prepare the same model that was saved, or pass strict=False."
            )
    wrong = [
        f"{k}: saved {tuple(v.shape)}, model {tuple(live[k].shape)}"
        for k, v in loaded.items()
        if k in live and isinstance(v, torch.Tensor) and isinstance(live[k], torch.Tensor) and v.shape != live[k].shape
    ]
    if wrong:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the model (shape mismatch: {_few(wrong)}). Nothing was loaded."
        )


def check_optimizer_state(
    optimizer: torch.optim.Optimizer, loaded: Any, path: Path, shapes: Mapping[Any, Any] | None = None
) -> None:
    """`loaded` is an optimizer state dict for the same parameter groups, with state of matching shapes.

    `shapes`: the full shape of each parameter by its key in `loaded`, where the live parameter is a flattened
    shard of it (FSDP1's); a key not there is checked against the parameter's own shape."""
    if not isinstance(loaded, dict) or not isinstance(loaded.get("param_groups"), list) or "state" not in loaded:
        raise CheckpointError(f"Checkpoint file {path} is not an optimizer state dict. Nothing was loaded.")
    groups = optimizer.param_groups
    saved_sizes = [len(g.get("params", [])) for g in loaded["param_groups"]]
    live_sizes = [len(g["params"]) for g in groups]
    if saved_sizes != live_sizes:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the optimizer: parameter groups of sizes {saved_sizes} were saved, "
            f"the optimizer has {live_sizes}. Nothing was loaded."
        )
    ids = [pid for g in loaded["param_groups"] for pid in g["params"]]
    params = {pid: p for pid, p in zip(ids, (p for g in groups for p in g["params"]))}
    for pid, state in loaded["state"].items():
        param = params.get(pid)
        if param is None or not isinstance(state, dict):
            raise CheckpointError(f"Checkpoint file {path} holds state for an unknown parameter {pid!r}.")
        for key, value in state.items():
            # State shaped like its parameter (Adam's moments) must match it; factored or scalar
            # state (Adafactor's rows, step counters) has fewer dimensions and is left alone.
            shape = torch.Size((shapes or {}).get(pid, param.shape))
            if isinstance(value, torch.Tensor) and value.dim() == len(shape) > 0 and value.shape != shape:
                raise CheckpointError(
                    f"Checkpoint file {path} does not fit the optimizer: state {key!r} of parameter {pid} has shape "
                    f"{tuple(value.shape)}, the parameter {tuple(shape)}. Nothing was loaded."
                )


def check_mapping(value: Any, path: Path, what: str) -> None:
    """`value` is a dict (a state dict of a scheduler, scaler or registered object)."""
    if not isinstance(value, dict):
        raise CheckpointError(f"Checkpoint file {path} does not hold a {what} state (got {type(value).__name__}).")


def check_loader_states(value: Any, path: Path, loaders: Sequence[Any] = ()) -> None:
    """`dataloaders.json` is a list of loader positions: `epoch` and `batches_yielded` (ints >= 0),
    `seed` (an int or null) and `epoch_rng` (generator states, base64 text) when present.

    With the live `loaders`, each saved generator state must be as long as the state of the
    generator it goes back into (`epoch_rng_sizes`): a wrong one would load, then fail in torch
    at the next iteration, naming no file.
    """
    if not (isinstance(value, list) and all(isinstance(s, dict) for s in value)):
        raise CheckpointError(f"Checkpoint file {path} does not hold data loader positions. Nothing was loaded.")
    for i, state in enumerate(value):
        wrong = [key for key in ("epoch", "batches_yielded") if not _count(state.get(key))]
        seed = state.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            wrong.append("seed")
        rng = state.get("epoch_rng")
        if rng is not None and not (isinstance(rng, dict) and all(_base64(v) for v in rng.values())):
            wrong.append("epoch_rng")
        if wrong:
            raise CheckpointError(
                f"Checkpoint file {path} does not hold a position for data loader {i}: {', '.join(wrong)} missing or "
                f"malformed (got {_brief(state)}). Nothing was loaded."
            )
    for i, (loader, state) in enumerate(zip(loaders, value)):
        sizes = loader.epoch_rng_sizes() if hasattr(loader, "epoch_rng_sizes") else {}
        for name, text in (state.get("epoch_rng") or {}).items():
            saved = len(_decoded(text))
            if name in sizes and saved != sizes[name]:
                raise CheckpointError(
                    f"Checkpoint file {path} holds a {name!r} generator state of {saved} bytes for data loader {i}, "
                    f"whose generator's state is {sizes[name]} bytes: it is corrupted. Nothing was loaded."
                )


def check_scaler_state(value: Any, live: dict[str, Any], path: Path) -> None:
    """A grad scaler's state holds every entry the live scaler's has (it reads them all on load)."""
    check_mapping(value, path, "grad scaler")
    missing = sorted(set(live) - set(value))
    if missing:
        raise CheckpointError(
            f"Checkpoint file {path} does not hold a grad scaler state: {_few(missing)} missing. Nothing was loaded."
        )


def check_rng_state(value: Any, live: dict[str, Any], path: Path) -> None:
    """A random-state file has every generator the live state has, each of the same form.

    The device generators' state is compared only in kind (tensors, a list of tensors, a seed)
    and only when both sides have one: a checkpoint may move between devices, or between
    machines that see a different number of them.
    """
    if not isinstance(value, dict):
        raise CheckpointError(
            f"Checkpoint file {path} does not hold random states (got {type(value).__name__}). Nothing was loaded."
        )
    missing = sorted(k for k, v in live.items() if k not in value and v is not None)
    if missing:
        raise CheckpointError(
            f"Checkpoint file {path} does not hold random states: {_few(missing)} missing. Nothing was loaded."
        )
    for key, mine in live.items():
        theirs = value.get(key)
        if key == "device":
            if mine is None or theirs is None:
                continue
            problem = None if _kind(theirs) == _kind(mine) else f"{_kind(theirs)}, expected {_kind(mine)}"
        else:
            problem = _form_difference(theirs, mine)
        if problem:
            raise CheckpointError(
                f"Checkpoint file {path} holds a {key!r} random state of another form ({problem}). Nothing was loaded."
            )


def _kind(state: Any) -> str:
    """A device RNG state reduced to its kind: a tensor's dtype (not its length), a sequence's element kinds."""
    if isinstance(state, torch.Tensor):
        return f"a {state.dtype} tensor"
    if isinstance(state, (list, tuple)):
        return f"a sequence of {' or '.join(sorted({_kind(s) for s in state})) or 'nothing'}"
    return type(state).__name__


def _form_difference(saved: Any, live: Any, where: str = "") -> str | None:
    """Where `saved` differs in form from `live` (container kinds, keys, lengths, tensor dtypes and shapes)."""
    if isinstance(live, torch.Tensor):
        if not isinstance(saved, torch.Tensor):
            return f"{where or 'value'}: a tensor expected, got {type(saved).__name__}"
        if saved.dtype != live.dtype or saved.shape != live.shape:
            return f"{where or 'value'}: {saved.dtype} {tuple(saved.shape)}, expected {live.dtype} {tuple(live.shape)}"
        return None
    if isinstance(live, dict):
        if not isinstance(saved, dict) or set(saved) != set(live):
            return f"{where or 'value'}: keys {_brief(saved)}, expected {sorted(live)}"
        return next((p for k in live if (p := _form_difference(saved[k], live[k], f"{where}[{k!r}]"))), None)
    if isinstance(live, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(live):
            return f"{where or 'value'}: {_brief(saved)}, expected a sequence of {len(live)}"
        if all(type(b) is int for b in live) and all(type(a) is int for a in saved):
            return None  # (Python's RNG state: 625 numbers, checked at once)
        return next(
            (p for i, (a, b) in enumerate(zip(saved, live)) if (p := _form_difference(a, b, f"{where}[{i}]"))), None
        )
    if isinstance(live, (int, float)) and not isinstance(live, bool):
        ok = isinstance(saved, (int, float)) and not isinstance(saved, bool)
        return None if ok else f"{where or 'value'}: a number expected, got {type(saved).__name__}"
    if isinstance(live, str) and not isinstance(saved, str):
        return f"{where or 'value'}: text expected, got {type(saved).__name__}"
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _base64(value: Any) -> bool:
    import binascii

    try:
        return isinstance(value, str) and bool(_decoded(value))
    except (binascii.Error, ValueError):
        return False


def _decoded(text: str) -> bytes:
    import base64

    return base64.b64decode(text, validate=True)


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(map(repr, list(value)[:6])) + (", ..." if len(value) > 6 else "") + "}"
    text = repr(value) if not isinstance(value, torch.Tensor) else f"a tensor {tuple(value.shape)}"
    return text if len(text) <= 60 else text[:57] + "..."


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit]) or "none"
    return shown + (f" (and {len(items) - limit} more)" if len(items) > limit else "")


def in_engine_checkpoint(scheduler: Any) -> bool:
    """Whether a prepared scheduler is stepped by a strategy's engine, which checkpoints it itself."""
    return bool(getattr(getattr(scheduler, "scheduler", None), "in_engine_checkpoint", False))
