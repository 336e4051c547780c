"""`accel merge-weights`: one safetensors file from a sharded checkpoint, like `accelerate merge-weights`.

    accel merge-weights CHECKPOINT_DIR OUTPUT_DIR [--unsafe_serialization] [--remove_checkpoint_dir]

CHECKPOINT_DIR is a folder `save_state` wrote under FSDP2 with SHARDED_STATE_DICT (its
`pytorch_model_fsdp_0/`, or that folder itself: torch.distributed.checkpoint shards), or
under DeepSpeed ZeRO (its engine checkpoint; needs deepspeed). The merged weights go to
`OUTPUT_DIR/model.safetensors`. Runs on one CPU process and needs memory for the whole model.
Sharded checkpoints are read with the same restricted readers as `load_state`: nothing in
them can run code. Every file is checked to be a regular file before it is opened (a FIFO or
device in a shard's place is refused by name), tensor sizes in the metadata must fit the shard
files, an existing merged file is never overwritten, and with `--remove_checkpoint_dir` only the
files it read are deleted (never its own output: an output folder inside the checkpoint folder
is refused before anything is read).
"""

from __future__ import annotations

import argparse
import os
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
        help="delete the files it merged (and the folder, once empty) after the merged file is written",
    )
    return p


def _dcp_folder(directory: Path) -> Path | None:
    if (directory / ".metadata").is_file():
        return directory
    if (directory / "pytorch_model_fsdp_0" / ".metadata").is_file():
        return directory / "pytorch_model_fsdp_0"
    return None


def read_dcp_model(folder: Path, read: list[Path] | None = None) -> dict[str, Any]:
    """The full model state dict of a torch.distributed.checkpoint folder, on the CPU, in one process.

    Appends every file it reads to `read`.

    Raises:
        CheckpointError: damaged or incomplete shards, a shard that is not a regular file, or tensor
            sizes the shard files cannot hold. UnsafeCheckpointError: an item would run code.
    """
    from ..checkpoint.dcp import read_full

    # save_state writes {"model": state_dict}.
    state = read_full(folder, read)
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
    *,
    overwrite: bool = False,
) -> Path:
    """Merge the sharded model weights in `checkpoint_dir` into `output_path/model.safetensors`.

    Returns the written file, which replaces an existing one (atomically) only with `overwrite`
    (Accelerate's `merge_fsdp_weights` overwrites; the command never does). With `remove_checkpoint_dir`, afterwards deletes the files it read
    (an accel checkpoint's manifest first, so that what remains never passes for a complete
    checkpoint) and every folder that empties; anything else in the folder is kept, and named.

    Raises:
        UsageError: a folder that holds no sharded checkpoint (saying what it expected), an existing
            output file, an output folder inside the checkpoint folder with `remove_checkpoint_dir`.
        CheckpointError: damaged shards, a shard that is not a regular file.
    """
    directory, output = Path(checkpoint_dir), Path(output_path)
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a folder")
    target = output / ("model.safetensors" if safe_serialization else "pytorch_model.bin")
    if remove_checkpoint_dir and output.resolve().is_relative_to(directory.resolve()):
        raise UsageError(
            f"--remove_checkpoint_dir with an output_path inside the checkpoint folder ({output} is in {directory}) "
            "would delete the merged file with the checkpoint. Nothing was done; choose an output_path outside it"
        )
    if os.path.lexists(target) and not overwrite:
        raise UsageError(
            f"{target} already exists: merge-weights does not overwrite it. Move it, or choose another output_path"
        )
    if output.exists() and not output.is_dir():
        raise UsageError(f"output_path {output} is a file, not a folder. Choose another output_path")
    folder = _dcp_folder(directory)
    read: list[Path] = []
    if folder is not None:
        _verify_against_manifest(directory, folder.glob("*"))
        state = read_dcp_model(folder, read)
    elif any(directory.glob("*/*model_states.pt")):
        from ..checkpoint.dcp import regular_size

        read = sorted(directory.glob("*/*_states.pt"))
        for path in read:
            regular_size(path)
        _verify_against_manifest(directory, read)
        state = read_deepspeed_model(directory)
    elif (directory / "model.safetensors").is_file():
        raise UsageError(f"{directory} holds full weights already (model.safetensors): there is nothing to merge")
    else:
        raise UsageError(
            f"{directory} holds no sharded checkpoint: expected a save_state folder with pytorch_model_fsdp_0/ "
            "(FSDP2, SHARDED_STATE_DICT), a torch.distributed.checkpoint folder (.metadata), or a DeepSpeed one"
        )
    output.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    try:
        if safe_serialization:
            from safetensors.torch import save_file

            save_file({k: v.contiguous() for k, v in state.items()}, str(tmp), metadata={"format": "pt"})
        else:
            import torch

            torch.save(state, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    if remove_checkpoint_dir:
        _remove_read(directory, read)
    return target


def _verify_against_manifest(directory: Path, paths: Any) -> None:
    """Where `directory` is an accel checkpoint, each shard must match the digest its manifest records, in the
    algorithm it was recorded in (chunked XXH3-128; XXH3-128, BLAKE3 or SHA-256 in checkpoints written before)."""
    from ..checkpoint.io import hash_file
    from ..checkpoint.layout import locate

    found = locate(directory)
    if found is None:
        return
    for path in sorted(paths):
        recorded = found.sha256(path.relative_to(directory).as_posix())
        if recorded is not None and hash_file(found.path(path.relative_to(directory).as_posix()), recorded) != recorded:
            raise CheckpointError(
                f"Sharded checkpoint file {path} does not match the digest its checkpoint's manifest records: it is "
                "truncated or corrupted. Nothing was merged."
            )


def _remove_read(directory: Path, read: list[Path]) -> None:
    """Delete the files merged (an accel manifest first), then each folder they leave empty; say what stays."""
    from ..checkpoint.layout import MANIFEST

    (directory / MANIFEST).unlink(missing_ok=True)  # what remains is no longer a complete checkpoint
    for path in read:
        path.unlink(missing_ok=True)  # a link goes as a link
    for parent in sorted({p.parent for p in read}, key=lambda p: len(p.parts), reverse=True):
        for folder in [parent, *parent.parents]:
            if not folder.is_relative_to(directory) or folder.is_symlink() or any(folder.iterdir()):
                break
            folder.rmdir()
    if directory.exists():
        kept = sorted(p.name for p in directory.iterdir())
        print(
            f"accel merge-weights: kept {directory}: it holds files merge-weights did not read "
            f"({', '.join(kept[:8])}{', ...' if len(kept) > 8 else ''}); delete them yourself if you no longer need them"
        )


def merge_weights_command(argv: Sequence[str]) -> int:
    """Run `accel merge-weights ARGV`."""
    ns = parser().parse_args(list(argv))
    target = merge_weights(
        ns.checkpoint_directory, ns.output_path, not ns.unsafe_serialization, ns.remove_checkpoint_dir
    )
    print(f"accel merge-weights: wrote {target}")
    return 0
