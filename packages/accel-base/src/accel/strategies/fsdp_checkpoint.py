"""Saving and loading FSDP2 models and optimizers, full or sharded.

Full: gathered onto the main process (`torch.distributed.checkpoint.state_dict` with
`full_state_dict=True, cpu_offload=True`) and written as `model.safetensors` and
`optimizer.bin`, the same files as an unsharded run (the optimizer's state keyed by parameter
name). Sharded: every process writes its shards with `torch.distributed.checkpoint` into
`pytorch_model_fsdp_<i>/` and `optimizer_<i>/` (read through `accel.checkpoint.dcp`'s
restricted readers, at any world size). Loading looks at what is on disk, so either kind, or a
checkpoint of one process or DDP, loads under either setting; a run that does not shard reads
them all in `accel.checkpoint.validate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..checkpoint import layout
from ..checkpoint import state as ckpt
from ..checkpoint.dcp import load_into, model_folder, optimizer_folder, saved_entries
from ..checkpoint.optimizer_keys import parameter_names, rekey
from ..checkpoint.validate import check_model_state, check_optimizer_state, read_sharded
from ..errors import CheckpointError
from ..prepare.wrappers import strip_compile
from .fsdp1 import check_flat_optimizer_state, flat_group_names

if TYPE_CHECKING:
    from ..prepare.prepared import Prepared, RunContext


def state_dict_options(**kwargs: Any) -> Any:
    """torch's `StateDictOptions(**kwargs)` (imported when first needed)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _is_fsdp(model: nn.Module) -> bool:
    """Whether `model` is sharded (FSDP2 units, or tensor-parallel DTensor weights)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    from torch.distributed.tensor import DTensor

    return any(isinstance(m, (FSDPModule, FSDP1)) for m in model.modules()) or any(
        isinstance(p, DTensor) for p in model.parameters()
    )


def _host_copy(model: nn.Module) -> bool:
    """Whether a full state dict is copied to host memory (`cpu_offload`). Not for FSDP1 units already there:
    torch's copy of host shards into host memory crashes the process (torch 2.13, gloo)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    return not any(isinstance(m, FSDP1) and getattr(m.compute_device, "type", None) == "cpu" for m in model.modules())


def gather_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on the main process (others get `{}`), in host memory."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(
        model, options=state_dict_options(full_state_dict=True, cpu_offload=_host_copy(model))
    )
    return state


def load_full_model_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full state dict (present on every process) into the shards of `model`."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state_dict), options=state_dict_options(full_state_dict=True, strict=strict))


def _file(kind: str, i: int, ext: str) -> str:
    return f"{kind}.{ext}" if i == 0 else f"{kind}_{i}.{ext}"


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a prepared (wrapped) one, or `optimizer` itself."""
    return getattr(optimizer, "optimizer", optimizer)  # type: ignore[no-any-return]


def _owner(optimizer: torch.optim.Optimizer, models: list[nn.Module]) -> nn.Module | None:
    """The sharded model whose parameters `optimizer` updates (None: no sharded model)."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    owners = [m for m in models if _is_fsdp(m) and ids & {id(p) for p in m.parameters()}]
    if len(owners) > 1:
        raise ValueError(
            "An optimizer updates parameters of several FSDP2 models; its state cannot be saved per model. "
            "Use one optimizer per model."
        )
    return owners[0] if owners else None


def save_models_and_optimizers(
    prepared: Prepared, ctx: RunContext, directory: Path, *, sharded: bool, safe_serialization: bool
) -> list[str]:
    """Write every prepared model and optimizer into `directory`; returns the names written.

    Runs on every process (the gathers and sharded writes are collective).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    writer = ctx.is_main_process
    files: list[str] = []
    for i, model in enumerate(prepared.models):
        if sharded and _is_fsdp(model):
            name = model_folder(i)
            dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(directory / name))
        else:
            name = _file("model", i, "safetensors" if safe_serialization else "bin")
            state_dict = ctx.strategy.full_state_dict(strip_compile(model))
            if writer and safe_serialization:
                ckpt.save_safetensors(state_dict, directory / name)
            elif writer:
                ckpt.save_torch({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, directory / name)
        files.append(name)
    for i, opt in enumerate(prepared.optimizers):
        inner = inner_optimizer(opt)
        owner = _owner(inner, prepared.models)
        if owner is not None and sharded:
            name = optimizer_folder(i)
            dcp.save({"optimizer": get_optimizer_state_dict(owner, inner)}, checkpoint_id=str(directory / name))
        else:
            name = _file("optimizer", i, "bin")
            state = (
                inner.state_dict()
                if owner is None
                else get_optimizer_state_dict(
                    owner, inner, options=state_dict_options(full_state_dict=True, cpu_offload=_host_copy(owner))
                )
            )
            if writer:
                ckpt.save_torch(state, directory / name)
        files.append(name)
    return files


def load_models_and_optimizers(prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> None:
    """Restore what `save_models_and_optimizers` wrote (full or sharded, whichever is on disk).

    In three phases, each finished on every rank before the next starts: every file (of a
    sharded folder: its metadata) is read and checked against the live models and optimizers;
    sharded folders are read into copies of the live shards; only then is anything applied. A
    failure in the first two phases raises on every rank and leaves every model and optimizer
    as it was.

    Raises:
        CheckpointError: a missing, truncated or corrupted file or shard folder, or one that does
            not fit the model or optimizer (a missing or unexpected key, a tensor or optimizer
            state of another shape), naming it.
        UnsafeCheckpointError: a file that would need arbitrary code to load.
    """
    what = f"load_state({directory})"
    plan = ckpt.run_on_every_rank(ctx, lambda: _read_and_check(prepared, directory, strict), what)
    # Reading an optimizer's sharded state initialises a fresh optimizer's state (torch's
    # get_optimizer_state_dict takes a zero step); a failed read must not leave that behind.
    fresh = [entry["inner"] for entry in plan["optimizers"] if not entry["inner"].state]
    try:
        ckpt.run_on_every_rank(ctx, lambda: _read_shards(plan), what)
    except Exception:
        for inner in fresh:
            inner.state.clear()
        raise
    _apply(ctx, plan, strict)


def _read_and_check(prepared: Prepared, directory: Path, strict: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    plan: dict[str, Any] = {"models": [], "optimizers": []}
    shapes: dict[int, dict[str, Any]] = {}
    hashes = _hashes_to_check(directory)
    for i, model in enumerate(prepared.models):
        module = strip_compile(model)
        # Sharded: the live shards themselves (DTensors; `.shape` is the global shape), no copy.
        live = get_model_state_dict(module)
        shapes[id(model)] = live
        folder = directory / model_folder(i)
        if folder.is_dir() and _is_fsdp(model):
            saved = saved_entries(folder, "model.")
            check_model_state(live, saved, folder / ".metadata", strict=strict)
            plan["models"].append(
                {"model": model, "folder": folder, "live": {k: v for k, v in live.items() if k in saved}}
            )
            continue
        path = directory / _file("model", i, "safetensors")
        if folder.is_dir():  # a model this run does not shard: its weights read whole
            path, state_dict = folder, read_sharded(folder, "model")
        elif not path.is_file():
            path = directory / _file("model", i, "bin")
            state_dict = ckpt.load_torch(path, sha256=hashes.get(path.name))
        else:
            state_dict = ckpt.load_safetensors(path, sha256=hashes.get(path.name))
        check_model_state(live, state_dict, path, strict=strict)
        plan["models"].append({"model": model, "state": state_dict})
    for i, opt in enumerate(prepared.optimizers):
        inner = inner_optimizer(opt)
        owner = _owner(inner, prepared.models)
        folder = directory / optimizer_folder(i)
        entry = {"opt": opt, "inner": inner, "owner": owner}
        if owner is not None and folder.is_dir():
            _check_sharded_optimizer(saved_entries(folder, "optimizer.state."), shapes[id(owner)], folder)
            plan["optimizers"].append({**entry, "folder": folder})
            continue
        if folder.is_dir():
            path, saved = folder, read_sharded(folder, "optimizer")
        else:
            path = directory / _file("optimizer", i, "bin")
            saved = ckpt.load_torch(path, map_location="cpu", sha256=hashes.get(path.name))
        full_shapes = None if owner is None else {k: v.shape for k, v in shapes[id(owner)].items()}
        flat_groups = None if owner is None else flat_group_names(inner, strip_compile(owner))
        if flat_groups is not None:  # FSDP1's flat parameters: torch maps the named state onto them
            check_flat_optimizer_state(saved, flat_groups, full_shapes or {}, path)
            plan["optimizers"].append({**entry, "state": saved})
            continue
        # FSDP2 loads a full optimizer state keyed by parameter name, a plain optimizer one keyed by position;
        # the checkpoint may hold either (saved sharded or full, or by one process or DDP).
        modules = [strip_compile(owner)] if owner is not None else [strip_compile(m) for m in prepared.models]
        state = rekey(saved, inner, parameter_names(inner, modules), by_name=owner is not None, path=path)
        check_optimizer_state(inner, state, path, full_shapes)
        plan["optimizers"].append({**entry, "state": state})
    return plan


def _hashes_to_check(directory: Path) -> dict[str, str]:
    """The recorded SHA-256 of each default file (a checkpoint of one process or DDP): `load_state` verifies
    only the files a strategy wrote itself (once, spread over the ranks), and this loader reads the rest."""
    found = layout.locate(directory)
    if found is None:
        return {}
    own = set(found.manifest.get("strategy_files", []))
    return {name: sha for name, sha in found.hashes.items() if name not in own}


def _check_sharded_optimizer(saved: dict[str, Any], params: dict[str, Any], folder: Path) -> None:
    """Each saved state (`<parameter>.<name>`) belongs to a parameter of the model; one shaped like it matches it."""
    for key, value in saved.items():
        fqn, _, name = key.rpartition(".")
        param = params.get(fqn)
        if param is None:
            raise CheckpointError(
                f"Sharded checkpoint {folder} does not fit the optimizer: it holds state {name!r} for {fqn!r}, which "
                "the model does not have. Nothing was loaded."
            )
        if isinstance(value, torch.Tensor) and value.dim() == param.dim() > 0 and value.shape != param.shape:
            raise CheckpointError(
                f"Sharded checkpoint {folder} does not fit the optimizer: state {name!r} of {fqn!r} has shape "
                f"{tuple(value.shape)}, the parameter {tuple(param.shape)}. Nothing was loaded."
            )


def _copy(tree: Any) -> Any:
    """`tree` with every tensor copied (a DTensor stays a DTensor, sharded the same way)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy(v) for v in tree]
    return tree


def _read_shards(plan: dict[str, Any]) -> None:
    """Read every sharded folder into copies of the live shards (torch.distributed.checkpoint reads in place)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    for entry in plan["models"]:
        if "folder" in entry:
            target = {"model": _copy(entry.pop("live"))}
            load_into(target, entry["folder"])
            entry["state"] = target["model"]
    for entry in plan["optimizers"]:
        if "folder" in entry:
            target = {"optimizer": _copy(get_optimizer_state_dict(entry["owner"], entry["inner"]))}
            load_into(target, entry["folder"])
            entry["state"] = target["optimizer"]


def _apply(ctx: RunContext, plan: dict[str, Any], strict: bool) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    for entry in plan["models"]:
        if "folder" in entry:
            set_model_state_dict(entry["model"], entry["state"], options=state_dict_options(strict=strict))
        else:
            ctx.strategy.load_full_state_dict(strip_compile(entry["model"]), entry["state"], strict=strict)
    for entry in plan["optimizers"]:
        if entry["owner"] is None:
            entry["opt"].load_state_dict(entry["state"])
        else:
            full = "folder" not in entry
            set_optimizer_state_dict(
                entry["owner"], entry["inner"], entry["state"], options=state_dict_options(full_state_dict=full)
            )
