"""Iterable datasets sharded by batches: every rank reads the stream, each keeps its slice.

The stream is cut into rounds of `total_batch_size` samples (the loader's batch size times
the number of processes, or the batch size itself with `split_batches`); rank r keeps
slice r of every round, so consecutive ranks see consecutive samples, as in Accelerate's
`IterableDatasetShard`. The short last round is

- dropped with `drop_last`,
- with `even_batches`, filled with the epoch's first samples so every rank gets a full
  batch; `remainder` then says how many samples of that round are real, which is what
  `gather_for_metrics` keeps (Accelerate cannot, since a stream has no length),
- otherwise split as it is: some ranks get a short batch or none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset


def cycle_pad(pool: list[Any], count: int) -> list[Any]:
    """`count` items taken from `pool` in order, starting over as often as needed."""
    if count <= 0:
        return []
    if not pool:
        raise ValueError("Cannot pad the last batch of an empty dataset.")
    return [pool[i % len(pool)] for i in range(count)]


class IterableDatasetShard(IterableDataset):  # type: ignore[type-arg]
    """This rank's samples of an iterable dataset, whole rounds at a time.

    Args:
        dataset: the user's iterable dataset; `set_epoch` is forwarded to it when it has one.
        batch_size: the user's loader batch size (per rank, or global with `split_batches`).
        drop_last, even_batches, split_batches: as for map-style loaders.

    Raises:
        ValueError: `split_batches` with a batch size that is no multiple of the processes.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        num_processes: int,
        process_index: int,
        drop_last: bool = False,
        even_batches: bool = True,
        split_batches: bool = False,
    ) -> None:
        if split_batches and batch_size % num_processes != 0:
            raise ValueError(
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({batch_size}) needs to be "
                f"a round multiple of the number of processes ({num_processes})."
            )
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.num_processes = num_processes
        self.process_index = process_index
        self.drop_last = drop_last
        self.even_batches = even_batches
        self.split_batches = split_batches
        self.epoch = 0
        self.remainder = -1
        self.skip_batches = 0

    @property
    def sampler(self) -> None:
        return None

    @property
    def total_batch_size(self) -> int:
        return self.batch_size if self.split_batches else self.batch_size * self.num_processes

    @property
    def process_batch_size(self) -> int:
        return self.batch_size // self.num_processes if self.split_batches else self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (only when the dataset has a length)."""
        n = len(self.dataset)
        total, per = self.total_batch_size, self.process_batch_size
        full, tail = divmod(n, total)
        if tail == 0 or self.drop_last:
            return full * per
        if self.even_batches:
            return (full + 1) * per
        return full * per + min(per, max(0, tail - self.process_index * per))

    def __iter__(self) -> Iterator[Any]:
        total, per = self.total_batch_size, self.process_batch_size
        lo = self.process_index * per
        skip, self.remainder = self.skip_batches, -1
        head: list[Any] | None = None
        current: list[Any] = []
        rounds = 0
        for item in self.dataset:
            current.append(item)
            if len(current) < total:
                continue
            if head is None:
                head = current
            if rounds >= skip:
                yield from current[lo : lo + per]
            rounds += 1
            self.remainder = 0
            current = []
        if not current or self.drop_last:
            return
        if self.even_batches:
            self.remainder = len(current)
            current = current + cycle_pad(head if head is not None else current, total - len(current))
        else:
            self.remainder = -1
        if rounds >= skip:
            yield from current[lo : lo + per]
