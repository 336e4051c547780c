"""Saving and loading FSDP2 models and optimizers, full or sharded.

Full: gathered onto the main process (`torch.distributed.checkpoint.state_dict` with
`full_state_dict=True, cpu_offload=True`) and written as `model.safetensors` and
`optimizer.bin`, the same files as an unsharded run. Sharded: every process writes its
shards with `torch.distributed.checkpoint` into `pytorch_model_fsdp_<i>/` and
`optimizer_<i>/`. Loading looks at what is on disk, so either kind loads under either
setting.

torch.distributed.checkpoint reads its `.metadata` with plain `pickle.load` and its
non-tensor items with `torch.load(weights_only=False)`; both are replaced here by
restricted readers, so a crafted checkpoint cannot run code (the rule of
`accel.checkpoint`).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..checkpoint import state as ckpt
from ..checkpoint.validate import check_model_state, check_optimizer_state
from ..errors import CheckpointError, UnsafeCheckpointError
from ..prepare.wrappers import strip_compile

if TYPE_CHECKING:
    from ..prepare.prepared import Prepared, RunContext


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _is_fsdp(model: nn.Module) -> bool:
    """Whether `model` is sharded (FSDP2 units, or tensor-parallel DTensor weights)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    return (
        isinstance(model, FSDPModule)
        or any(isinstance(m, FSDPModule) for m in model.modules())
        or any(isinstance(p, DTensor) for p in model.parameters())
    )


def gather_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on the main process (others get `{}`), in host memory."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=True))
    return state


def load_full_model_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load a full state dict (present on every process) into the shards of `model`."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(model, dict(state_dict), options=_options(full_state_dict=True, strict=strict))


def _file(kind: str, i: int, ext: str) -> str:
    return f"{kind}.{ext}" if i == 0 else f"{kind}_{i}.{ext}"


def _inner(optimizer: Any) -> torch.optim.Optimizer:
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
            name = f"pytorch_model_fsdp_{i}"
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
        inner = _inner(opt)
        owner = _owner(inner, prepared.models)
        if owner is not None and sharded:
            name = f"optimizer_{i}"
            dcp.save({"optimizer": get_optimizer_state_dict(owner, inner)}, checkpoint_id=str(directory / name))
        else:
            name = _file("optimizer", i, "bin")
            state = (
                inner.state_dict()
                if owner is None
                else get_optimizer_state_dict(owner, inner, options=_options(full_state_dict=True, cpu_offload=True))
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
    for i, model in enumerate(prepared.models):
        module = strip_compile(model)
        # Sharded: the live shards themselves (DTensors; `.shape` is the global shape), no copy.
        live = get_model_state_dict(module)
        shapes[id(model)] = live
        folder = directory / f"pytorch_model_fsdp_{i}"
        if folder.is_dir() and _is_fsdp(model):
            saved = _saved_tensors(folder, "model.")
            check_model_state(live, saved, folder / ".metadata", strict=strict)
            plan["models"].append(
                {"model": model, "folder": folder, "live": {k: v for k, v in live.items() if k in saved}}
            )
            continue
        path = directory / _file("model", i, "safetensors")
        if not path.is_file():
            path = directory / _file("model", i, "bin")
            state_dict = ckpt.load_torch(path)
        else:
            state_dict = ckpt.load_safetensors(path)
        check_model_state(live, state_dict, path, strict=strict)
        plan["models"].append({"model": model, "state": state_dict})
    for i, opt in enumerate(prepared.optimizers):
        inner = _inner(opt)
        owner = _owner(inner, prepared.models)
        folder = directory / f"optimizer_{i}"
        entry = {"opt": opt, "inner": inner, "owner": owner}
        if owner is not None and folder.is_dir():
            _check_sharded_optimizer(_saved_tensors(folder, "optimizer.state."), shapes[id(owner)], folder)
            plan["optimizers"].append({**entry, "folder": folder})
            continue
        path = directory / _file("optimizer", i, "bin")
        state = ckpt.load_torch(path, map_location="cpu")
        check_optimizer_state(inner, state, path)
        plan["optimizers"].append({**entry, "state": state})
    return plan


def _saved_tensors(folder: Path, prefix: str) -> dict[str, Any]:
    """The entries under `prefix` of a sharded checkpoint's metadata: tensors as meta tensors of the saved shape."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = _safe_reader(folder).read_metadata()
    return {
        key[len(prefix) :]: torch.empty(item.size, device="meta") if isinstance(item, TensorStorageMetadata) else item
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(prefix)
    }


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
            _dcp_load(target, entry["folder"])
            entry["state"] = target["model"]
    for entry in plan["optimizers"]:
        if "folder" in entry:
            target = {"optimizer": _copy(get_optimizer_state_dict(entry["owner"], entry["inner"]))}
            _dcp_load(target, entry["folder"])
            entry["state"] = target["optimizer"]


def _apply(ctx: RunContext, plan: dict[str, Any], strict: bool) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    for entry in plan["models"]:
        if "folder" in entry:
            set_model_state_dict(entry["model"], entry["state"], options=_options(strict=strict))
        else:
            ctx.strategy.load_full_state_dict(strip_compile(entry["model"]), entry["state"], strict=strict)
    for entry in plan["optimizers"]:
        if entry["owner"] is None:
            entry["opt"].load_state_dict(entry["state"])
        else:
            full = "folder" not in entry
            set_optimizer_state_dict(
                entry["owner"], entry["inner"], entry["state"], options=_options(full_state_dict=full)
            )


# ---- torch.distributed.checkpoint without unrestricted pickle -------------------------------
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


def _safe_reader(path: Path) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")
            meta_path = path / (".metadata" if rank is None else f"__{rank}.metadata")
            if not meta_path.is_file():
                raise CheckpointError(f"Sharded checkpoint {path} has no metadata file ({meta_path.name}).")
            with open(meta_path, "rb") as f:
                try:
                    metadata = _MetadataUnpickler(f).load()
                except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
                    raise CheckpointError(f"{meta_path} is truncated or corrupted ({exc}).") from exc
            if not isinstance(metadata, Metadata):
                raise CheckpointError(f"{meta_path} is not torch.distributed.checkpoint metadata.")
            storage_meta = metadata.storage_meta or StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            return metadata

    return SafeFileSystemReader(str(path))


def _safe_planner() -> Any:
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
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


def _dcp_load(target: dict[str, Any], folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(target, storage_reader=_safe_reader(folder), planner=_safe_planner())
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
