"""Prepared data loaders: sharding over ranks (`loader`), the prepared loader itself (`shard`), seeded
samplers (`samplers`), rank-0 dispatch (`dispatch`) and iterable datasets split by batches (`iterable`)."""

from .loader import prepare_data_loader, skip_first_batches
from .shard import DataLoaderShard

__all__ = ["DataLoaderShard", "prepare_data_loader", "skip_first_batches"]
