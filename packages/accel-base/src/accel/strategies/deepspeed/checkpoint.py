"""DeepSpeed's engine checkpoints are read by DeepSpeed with an unrestricted unpickler: refuse one that
would run code before DeepSpeed opens it."""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import CheckpointError, UnsafeCheckpointError

# Plain-data classes DeepSpeed pickles into its checkpoints (measured with 0.19.8, ZeRO 0-3,
# fp32 and bf16). Anything else in a file is refused before DeepSpeed's own loader, which
# unpickles without restriction, ever opens it.
ENGINE_CHECKPOINT_GLOBALS = frozenset(
    {
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.utils.tensor_fragment.fragment_address",
    }
)


def verify_engine_checkpoint(directory: Path) -> None:
    """Refuse an engine checkpoint whose files would run code when DeepSpeed unpickles them.

    Raises:
        CheckpointError: the directory is missing, or a file is damaged.
        UnsafeCheckpointError: a file references a class or function beyond tensors, plain
            containers and DeepSpeed's own plain-data classes. Nothing in it was run.
    """
    if not directory.is_dir():
        raise CheckpointError(f"{directory.parent} has no DeepSpeed checkpoint ({directory.name}/ is missing).")
    for path in sorted(directory.glob("*.pt")):
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception as exc:
            raise CheckpointError(
                f"Checkpoint file {path} could not be read ({exc}); it is truncated or corrupted."
            ) from exc
        unknown = sorted(set(found) - ENGINE_CHECKPOINT_GLOBALS)
        if unknown:
            raise UnsafeCheckpointError(
                f"Refusing to load {path}: it references {unknown}, which DeepSpeed's loader would import and run "
                "(unrestricted pickle). Nothing in it was run. Only load checkpoints you trust."
            )
