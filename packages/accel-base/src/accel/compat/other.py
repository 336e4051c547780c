"""Model and file helpers of Accelerate's `utils` (re-exported by `accel.utils`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ..prepare.wrappers import is_compiled_module


def extract_model_from_parallel(
    model: torch.nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True, recursive: bool = False
) -> torch.nn.Module:
    """The user's module out of DDP/FSDP/DeepSpeed-style wrappers (anything with a `.module`) and compile.

    With an `Accelerator`, prefer `accelerator.unwrap_model`, which also knows the strategy's own wrappers.
    `keep_fp32_wrapper=False` also removes the mixed-precision forward. `recursive=True` (as in Accelerate)
    also replaces every submodule that is such a wrapper by the module inside it, in place, all the way down.
    """
    from ..precision.base import remove_autocast_wrapper

    compiled = is_compiled_module(model)
    inner: Any = model._orig_mod if compiled else model
    if not compiled and not keep_torch_compile and "_orig_mod" in model.__dict__:
        inner = model.__dict__["_orig_mod"]  # regionally compiled (`compile_regions`): the module it copied
    while isinstance(getattr(inner, "module", None), torch.nn.Module):
        inner = inner.module
    if recursive:
        inner = _unwrap_children(inner)
    if not keep_fp32_wrapper:
        remove_autocast_wrapper(inner)
    if compiled and keep_torch_compile:
        model._orig_mod = inner  # type: ignore[assignment]
        return model
    return inner  # type: ignore[no-any-return]


def _unwrap_children(module: torch.nn.Module) -> torch.nn.Module:
    """`module` out of its `.module` wrappers, with each child unwrapped the same way (set in place)."""
    while isinstance(getattr(module, "module", None), torch.nn.Module):
        module = module.module  # type: ignore[assignment]
    for name, child in list(module.named_children()):
        unwrapped = _unwrap_children(child)
        if unwrapped is not child:
            setattr(module, name, unwrapped)
    return module


def wait_for_everyone() -> None:
    """Barrier: every process waits until all reach this point (`PartialState().wait_for_everyone()`)."""
    from ..distributed.state import PartialState

    PartialState().wait_for_everyone()


def save(
    obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False, safe_serialization: bool = False
) -> None:
    """Save `obj` from the main process only (each node's local main with `save_on_each_node`).

    `safe_serialization=True` writes a state dict of tensors with safetensors instead of pickle.
    """
    from ..distributed.state import PartialState

    state = PartialState()
    if not (state.is_local_main_process if save_on_each_node else state.is_main_process):
        return
    if safe_serialization:
        from safetensors.torch import save_file

        save_file(clean_state_dict_for_safetensors(obj), str(f), metadata={"format": "pt"})
    else:
        torch.save(obj, f)


def clean_state_dict_for_safetensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The state dict without shared storage (safetensors refuses tensors sharing memory): later aliases are
    dropped, and every tensor is made contiguous."""
    seen: dict[tuple[Any, Any], str] = {}
    cleaned: dict[str, Any] = {}
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            cleaned[name] = tensor
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if tensor.numel() and key in seen:
            continue
        seen[key] = name
        cleaned[name] = tensor.contiguous()
    return cleaned


def convert_bytes(size: float) -> str:
    """A byte count in human units (`1.5 GB`)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def get_pretty_name(obj: Any) -> str:
    """The qualified name of `obj`'s class (or of `obj` if it is a class or function)."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    return str(getattr(obj, "__qualname__", getattr(obj, "__name__", obj)))


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge `source` into `destination` recursively (nested dicts merged, other values replaced)."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """`getattr` through a dotted path (`recursive_getattr(model, "encoder.layer.0")`)."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def merge_fsdp_weights(
    checkpoint_dir: str, output_path: str, safe_serialization: bool = True, remove_checkpoint_dir: bool = False
) -> None:
    """Merge a sharded `torch.distributed.checkpoint` directory of model weights into one file, like Accelerate's.

    Writes `model.safetensors` (or `pytorch_model.bin`) under `output_path`, replacing one that is
    there. The main process merges (every process may call it: the others wait for it and raise its
    error); the shards are read with `load_state`'s restricted, checked readers (`accel merge-weights`),
    so nothing in them runs code and only regular files inside `checkpoint_dir` are read. With
    `remove_checkpoint_dir`, only the files it read are deleted afterwards, and folders they empty.

    Raises:
        ValueError: `checkpoint_dir` does not exist or holds no sharded model checkpoint, or
            `remove_checkpoint_dir` with an `output_path` inside `checkpoint_dir` (before anything is read).
        CheckpointError: damaged shards, or a shard that is not a regular file.
    """
    from ..commands.merge_weights import merge_weights
    from ..distributed.ops import broadcast_object_list
    from ..distributed.state import PartialState

    source = Path(checkpoint_dir)
    if not source.exists():
        raise ValueError(f"Tried to load from {source} but couldn't find a valid metadata file: it does not exist.")
    state = PartialState()
    error: Exception | None = None
    if state.is_main_process:
        try:
            merge_weights(source, output_path, safe_serialization, remove_checkpoint_dir, overwrite=True)
        except Exception as exc:
            error = exc
    if state.num_processes > 1:
        # Every process learns the main process's outcome, so none returns while the merge failed.
        [failure] = broadcast_object_list([None if error is None else f"{type(error).__name__}: {error}"])
        if error is None and failure is not None:
            raise RuntimeError(f"merge_fsdp_weights failed on the main process ({failure}); nothing was merged.")
    if error is not None:
        raise error


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` with `weights_only=True` unless told otherwise (no arbitrary pickle code runs)."""
    kwargs.setdefault("weights_only", True)
    return torch.load(f, map_location=map_location, **kwargs)


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on localhost:`port` (default 29500)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("localhost", port or 29500)) == 0


def has_compiled_regions(module: torch.nn.Module) -> bool:
    """Whether any submodule of `module` is a `torch.compile`d module."""
    return any(is_compiled_module(m) for m in module.modules())


def model_has_dtensor(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (sharded by FSDP2 or tensor parallelism)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def get_module_children_bottom_up(model: torch.nn.Module, return_fqns: bool = False) -> list[Any]:
    """Every submodule of `model` (itself last), children before their parents.

    With `return_fqns=True` (as in Accelerate), each entry is `(fully qualified name, module)`, the
    model itself named "".
    """
    order: list[tuple[str, torch.nn.Module]] = []

    def visit(prefix: str, module: torch.nn.Module) -> None:
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)
        order.append((prefix, module))

    visit("", model)
    return list(order) if return_fqns else [m for _, m in order]


def is_peft_model(model: Any) -> bool:
    """Whether `model` is a PEFT (LoRA, ...) model (False when peft is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def get_current_device_type() -> tuple[str, str]:
    """(device type, distributed type name) of the running process, e.g. ("cpu", "MULTI_CPU")."""
    from ..distributed.state import PartialState

    state = PartialState()
    return state.device.type, str(getattr(state.distributed_type, "value", state.distributed_type))


__all__ = [
    "clean_state_dict_for_safetensors",
    "get_current_device_type",
    "get_module_children_bottom_up",
    "has_compiled_regions",
    "is_peft_model",
    "is_port_in_use",
    "load",
    "model_has_dtensor",
    "convert_bytes",
    "extract_model_from_parallel",
    "get_pretty_name",
    "merge_dicts",
    "merge_fsdp_weights",
    "recursive_getattr",
    "save",
    "wait_for_everyone",
]
