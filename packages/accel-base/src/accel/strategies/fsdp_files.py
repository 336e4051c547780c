"""Accelerate's FSDP checkpoint functions (`accelerate.utils.save_fsdp_model`, ...) on accel's FSDP2 strategy.

transformers' `Trainer` saves and resumes its checkpoints under FSDP through these four functions, with
Accelerate 1.15's signatures. They write Accelerate's layout, chosen by `fsdp_plugin.state_dict_type`:

- "FULL_STATE_DICT": the gathered weights in `pytorch_model_fsdp.bin` (model i > 0:
  `pytorch_model_fsdp_<i>.bin`) and the gathered optimizer state, keyed by parameter name, in
  `optimizer.bin` (`optimizer_<i>.bin`), written by the main process;
- "SHARDED_STATE_DICT": torch.distributed.checkpoint folders `pytorch_model_fsdp_<i>/` and
  `optimizer_<i>/` (`{"model": ...}`, `{"optimizer": ...}` inside), every process writing its shards; with
  `use_dcp=False`, one file per process instead (`pytorch_model_fsdp_<i>_rank<r>.bin`,
  `optimizer_<i>_rank<r>.bin`), which only the same world size loads.

`adapter_only=True` on a peft model saves and loads only the trainable adapter weights. Files are written
atomically and read with accel's restricted readers (`accel.checkpoint.io`, `accel.checkpoint.dcp`): nothing
in a checkpoint can run code. The state dicts come from the same torch.distributed.checkpoint calls accel's
`save_state` uses (`accel.strategies.fsdp_checkpoint`), so either can be read by the merge tools.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..checkpoint.dcp import load_into, model_folder, optimizer_folder
from ..checkpoint.io import load_torch, save_torch
from .fsdp_checkpoint import inner_optimizer, state_dict_options

FSDP_MODEL_NAME = "pytorch_model_fsdp"
OPTIMIZER_NAME = "optimizer"


def _full(fsdp_plugin: Any) -> bool:
    """Whether the plugin asks for full (gathered) state dicts; accel's `FSDPConfig` or Accelerate's plugin."""
    kind = getattr(fsdp_plugin, "state_dict_type", None) or "FULL_STATE_DICT"
    name = str(getattr(kind, "name", kind)).upper()
    if name in ("LOCAL_STATE_DICT", "3"):
        raise ValueError(
            "FSDP2 does not support LOCAL_STATE_DICT. Set `fsdp_state_dict_type` to SHARDED_STATE_DICT or "
            "FULL_STATE_DICT."
        )
    return name not in ("SHARDED_STATE_DICT", "2")


def _sd_options(fsdp_plugin: Any, accelerator: Any, *, loading: bool = False) -> Any:
    """The `StateDictOptions` Accelerate uses: full state dicts gathered to host memory on the main process
    (and broadcast from it when loading) on several processes; shards as they are otherwise."""
    if not _full(fsdp_plugin):
        return state_dict_options(full_state_dict=False)
    several = accelerator.num_processes > 1
    return state_dict_options(full_state_dict=True, cpu_offload=several, broadcast_from_rank0=several and loading)


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _model_state(model: Any, options: Any, adapter_only: bool) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if adapter_only and _is_peft(model):
        if options.full_state_dict:
            return get_model_state_dict(model, options=replace(options, ignore_frozen_params=True))
        from peft import get_peft_model_state_dict

        return dict(get_peft_model_state_dict(model, adapter_name=model.active_adapter))
    return get_model_state_dict(model, options=options)


def _set_model_state(model: Any, state: dict[str, Any], options: Any, adapter_only: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    if adapter_only and _is_peft(model):
        if options.full_state_dict:
            return set_model_state_dict(model, state, options=replace(options, strict=False))
        from peft import set_peft_model_state_dict

        return set_peft_model_state_dict(model, state, adapter_name=model.active_adapter)
    return set_model_state_dict(model, state, options=options)


_STEMS = {"model": (FSDP_MODEL_NAME, model_folder), "optimizer": (OPTIMIZER_NAME, optimizer_folder)}
"""What a model's or an optimizer's state is saved as: the file stem and the sharded folder's name."""


def _full_file(key: str, index: int) -> str:
    stem = _STEMS[key][0]
    return f"{stem}.bin" if index == 0 else f"{stem}_{index}.bin"


def _rank_file(key: str, index: int, accelerator: Any) -> str:
    return f"{_STEMS[key][0]}_{index}_rank{accelerator.process_index}.bin"


def _write(
    state: dict[str, Any], key: str, index: int, accelerator: Any, output_dir: Any, *, full: bool, use_dcp: bool
) -> None:
    """Write `state` (the model's or optimizer's, `key`) where Accelerate writes it. Collective when sharded."""
    os.makedirs(output_dir, exist_ok=True)
    if full:
        if accelerator.process_index == 0:
            save_torch(state, Path(output_dir, _full_file(key, index)))
    elif use_dcp:
        import torch.distributed.checkpoint as dcp

        dcp.save({key: state}, checkpoint_id=str(Path(output_dir, _STEMS[key][1](index))))
    else:
        save_torch(state, Path(output_dir, _rank_file(key, index, accelerator)))


def _read(key: str, index: int, accelerator: Any, input_dir: Any, *, full: bool, use_dcp: bool, live: Any) -> Any:
    """Read what `_write` wrote; a sharded folder is read into `live()` (the live shards' state dict), in place.
    `input_dir` may also be the sharded folder itself, as Accelerate accepts."""
    if full:
        return load_torch(Path(input_dir, _full_file(key, index)))
    if not use_dcp:
        return load_torch(Path(input_dir, _rank_file(key, index, accelerator)))
    folder, name = Path(input_dir), _STEMS[key][1](index)
    target = {key: live()}
    load_into(target, folder if folder.name == name else folder / name)
    return target[key]


def save_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Save an FSDP2 model's weights into `output_dir` in Accelerate's layout (module docstring).

    Collective: call it on every process. `fsdp_plugin.state_dict_type` chooses full or sharded;
    `adapter_only` keeps only a peft model's adapter; `use_dcp=False` writes one file per process.
    """
    options = _sd_options(fsdp_plugin, accelerator)
    state = _model_state(model, options, adapter_only)
    _write(state, "model", model_index, accelerator, output_dir, full=options.full_state_dict, use_dcp=use_dcp)


def load_fsdp_model(
    fsdp_plugin: Any,
    accelerator: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    model_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> Any:
    """Load what `save_fsdp_model` wrote into the shards of `model`; returns torch's missing/unexpected keys.

    Collective. `input_dir` may also be the sharded folder itself (`.../pytorch_model_fsdp_0`).

    Raises:
        CheckpointError: a missing, truncated or corrupted file or shard folder (naming it).
        UnsafeCheckpointError: a file that would need arbitrary code to load.
    """
    accelerator.wait_for_everyone()
    options = _sd_options(fsdp_plugin, accelerator, loading=True)
    state: dict[str, Any] = {}  # a full state dict is broadcast from the main process
    if accelerator.process_index == 0 or not options.broadcast_from_rank0:
        state = _read(
            "model",
            model_index,
            accelerator,
            input_dir,
            full=options.full_state_dict,
            use_dcp=use_dcp,
            live=lambda: _model_state(model, options, adapter_only),
        )
    result = _set_model_state(model, state, options, adapter_only)
    accelerator.wait_for_everyone()
    return result


def save_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    output_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    use_dcp: bool = True,
) -> None:
    """Save the state of `optimizer` (which updates the FSDP2 `model`) into `output_dir` in Accelerate's layout.

    Collective. Full: `optimizer.bin` keyed by parameter name, written by the main process; sharded:
    the `optimizer_<i>/` folder (or, with `use_dcp=False`, one file per process).
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    options = _sd_options(fsdp_plugin, accelerator)
    state = get_optimizer_state_dict(model, inner_optimizer(optimizer), options=options)
    _write(state, "optimizer", optimizer_index, accelerator, output_dir, full=options.full_state_dict, use_dcp=use_dcp)


def load_fsdp_optimizer(
    fsdp_plugin: Any,
    accelerator: Any,
    optimizer: Any,
    model: torch.nn.Module,
    input_dir: str | os.PathLike[str],
    optimizer_index: int = 0,
    adapter_only: bool = False,
    use_dcp: bool = True,
) -> None:
    """Load what `save_fsdp_optimizer` wrote into `optimizer` (which updates the FSDP2 `model`).

    Collective. `adapter_only` is accepted for Accelerate's signature (the optimizer holds what it updates).

    Raises:
        CheckpointError: a missing, truncated or corrupted file or shard folder (naming it).
        UnsafeCheckpointError: a file that would need arbitrary code to load.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    accelerator.wait_for_everyone()
    inner = inner_optimizer(optimizer)
    # Every process reads a full file: torch's optimizer loader keys the state by the names it finds there.
    options = replace(_sd_options(fsdp_plugin, accelerator, loading=True), broadcast_from_rank0=False)
    state = _read(
        "optimizer",
        optimizer_index,
        accelerator,
        input_dir,
        full=options.full_state_dict,
        use_dcp=use_dcp,
        live=lambda: get_optimizer_state_dict(model, inner, options=options),
    )
    set_optimizer_state_dict(model, inner, state, options=options)
    accelerator.wait_for_everyone()
