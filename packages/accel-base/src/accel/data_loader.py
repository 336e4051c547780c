"""Accelerate's `data_loader` module path: prepared loaders, samplers and their helpers.

The code lives in `accel.data` (loaders), `accel.data.samplers`, `accel.data.iterable` and
`accel.data.dispatch`; `from accelerate.data_loader import X` becomes `from accel.data_loader import X`.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from .data.dispatch import DataLoaderDispatcher
from .data.iterable import IterableDatasetShard
from .data.loader import DataLoaderShard, prepare_data_loader, skip_first_batches
from .data.samplers import BatchSamplerShard, SeedableRandomSampler


def get_sampler(dataloader: DataLoader) -> Any:  # type: ignore[type-arg]
    """The loader's index sampler: the `sampler` of its batch sampler (or of a `BatchSampler` given as sampler)."""
    if isinstance(dataloader.sampler, BatchSampler):
        return getattr(dataloader.sampler, "sampler", None)
    return getattr(dataloader.batch_sampler, "sampler", None)


def __getattr__(name: str) -> Any:
    from .compat.table import missing_attribute

    return missing_attribute("accelerate.data_loader", name, __name__)


__all__ = [
    "BatchSamplerShard",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "get_sampler",
    "prepare_data_loader",
    "skip_first_batches",
]
