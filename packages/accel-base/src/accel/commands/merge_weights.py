"""`accel merge-weights`: one safetensors file from a sharded checkpoint, like `accelerate merge-weights`.

    accel merge-weights CHECKPOINT_DIR OUTPUT_DIR [--unsafe_serialization] [--remove_checkpoint_dir]

CHECKPOINT_DIR is a folder `save_state` wrote under FSDP2 with SHARDED_STATE_DICT (its
`pytorch_model_fsdp_0/`, or that folder itself: torch.distributed.checkpoint shards), or
under DeepSpeed ZeRO (its engine checkpoint; needs deepspeed). The merged weights go to
`OUTPUT_DIR/model.safetensors`. Runs on one CPU process and needs memory for the whole model.
Sharded checkpoints are read with the same restricted readers as `load_state`: nothing in
them can run code.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from . import CliParser, UsageError

MODEL_PREFIX = "model."


def parser() -> argparse.ArgumentParser:
    """The `accel merge-weights` parser (Accelerate's arguments)."""
    p = CliParser(prog="accel merge-weights", description="Merge a sharded checkpoint into one safetensors file.")
    p.add_argument("checkpoint_directory", help="a save_state folder (FSDP2 sharded or DeepSpeed), or its model shards")
    p.add_argument("output_path", help="folder for model.safetensors (pytorch_model.bin with --unsafe_serialization)")
    p.add_argument(
        "--unsafe_serialization",
        "--unsafe-serialization",
        action="store_true",
        help="write pytorch_model.bin (torch.save) instead of safetensors",
    )
    p.add_argument(
        "--remove_checkpoint_dir",
        "--remove-checkpoint-dir",
        action="store_true",
        help="delete the checkpoint folder once the merged file is written",
    )
    return p


def _dcp_folder(directory: Path) -> Path | None:
    if (directory / ".metadata").is_file():
        return directory
    if (directory / "pytorch_model_fsdp_0" / ".metadata").is_file():
        return directory / "pytorch_model_fsdp_0"
    return None


def read_dcp_model(folder: Path) -> dict[str, Any]:
    """The full model state dict of a torch.distributed.checkpoint folder, on the CPU, in one process.

    Raises:
        CheckpointError: damaged or incomplete shards. UnsafeCheckpointError: an item would run code.
    """
    from ..checkpoint.dcp import read_full

    # save_state writes {"model": state_dict}.
    state = read_full(folder)
    if "model" not in state:
        what = "an optimizer checkpoint" if "optimizer" in state else "not a model checkpoint"
        raise CheckpointError(f"{folder} is {what}; merge the model's (pytorch_model_fsdp_0/)")
    return dict(state["model"])


def read_deepspeed_model(directory: Path) -> dict[str, Any]:
    """fp32 weights of a DeepSpeed ZeRO checkpoint `save_state` wrote (DeepSpeed's zero_to_fp32).

    Raises:
        UsageError: deepspeed is not installed. UnsafeCheckpointError: a file would run code.
    """
    from ..strategies.deepspeed.strategy import CHECKPOINT_TAG, verify_engine_checkpoint

    try:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    except ImportError:
        raise UsageError(
            "merging a DeepSpeed checkpoint needs deepspeed: pip install 'accel-base[deepspeed]'"
        ) from None
    verify_engine_checkpoint(directory / CHECKPOINT_TAG)
    return dict(get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=CHECKPOINT_TAG))


def merge_weights(
    checkpoint_dir: str | Path,
    output_path: str | Path,
    safe_serialization: bool = True,
    remove_checkpoint_dir: bool = False,
) -> Path:
    """Merge the sharded model weights in `checkpoint_dir` into `output_path/model.safetensors`.

    Returns the written file. Raises `UsageError` for a folder that holds no sharded
    checkpoint (saying what it expected), `CheckpointError` for damaged shards.
    """
    directory, output = Path(checkpoint_dir), Path(output_path)
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a folder")
    folder = _dcp_folder(directory)
    if folder is not None:
        state = read_dcp_model(folder)
    elif any(directory.glob("*/*model_states.pt")):
        state = read_deepspeed_model(directory)
    elif (directory / "model.safetensors").is_file():
        raise UsageError(f"{directory} holds full weights already (model.safetensors): there is nothing to merge")
    else:
        raise UsageError(
            f"{directory} holds no sharded checkpoint: expected a save_state folder with pytorch_model_fsdp_0/ "
            "(FSDP2, SHARDED_STATE_DICT), a torch.distributed.checkpoint folder (.metadata), or a DeepSpeed one"
        )
    output.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        target = output / "model.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(target), metadata={"format": "pt"})
    else:
        import torch

        target = output / "pytorch_model.bin"
        torch.save(state, target)
    if remove_checkpoint_dir:
        shutil.rmtree(directory)
    return target


def merge_weights_command(argv: Sequence[str]) -> int:
    """Run `accel merge-weights ARGV`."""
    ns = parser().parse_args(list(argv))
    target = merge_weights(
        ns.checkpoint_directory, ns.output_path, not ns.unsafe_serialization, ns.remove_checkpoint_dir
    )
    print(f"accel merge-weights: wrote {target}")
    return 0
