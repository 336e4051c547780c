"""Samplers of prepared map-style loaders: a seeded shuffle and this rank's share of the batches.

`SeedableRandomSampler` draws its permutation from a seed fixed at prepare time plus the
epoch, so every rank has the same order without a collective per epoch. `BatchSamplerShard`
deals the user's batches out to the ranks (or splits each one), padding the last round
with the epoch's first samples under `even_batches` and recording in `remainder` how many
samples of that round are real.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import RandomSampler, Sampler

from .iterable import cycle_pad


def shuffle_must_agree(num_processes: int) -> bool:
    """Whether several processes must draw the same default-sampler shuffle (rank 0's generator state).

    True when the data is sharded over several processes, and also when it is not but other processes
    exist: a strategy whose data-parallel group is smaller than the world (each model split over several
    processes) gives every process of one replica the same data, so their orders must agree even though
    no `set_seed` aligned their global generators. The synchronisation broadcasts over every process.
    """
    import torch.distributed as dist

    return num_processes > 1 or (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


class SeedableRandomSampler(RandomSampler):
    """A random permutation drawn from a seed plus the epoch: identical on every rank.

    `set_epoch(e)` selects the permutation; the same (seed, epoch) always gives the same one,
    and the same one as Accelerate's sampler of that name. A complete pass moves to the
    next epoch. The seed is `seed`, else
    `data_seed`, else torch's initial seed (what `set_seed` set). `generator`, if given, is
    the generator reseeded and drawn from (Accelerate's signature); by default a
    private one.
    """

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
        data_seed: int | None = None,
    ) -> None:
        super().__init__(data_source, replacement=replacement, num_samples=num_samples, generator=generator)
        if seed is None:
            seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.seed = int(seed)
        self.epoch = 0

    @property
    def initial_seed(self) -> int:
        """Accelerate's name for `seed`."""
        return self.seed

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        g = self.generator if self.generator is not None else torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        n = len(self.data_source)
        # Drawn exactly as `RandomSampler` draws from a generator it is given.
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from torch.randint(high=n, size=(32,), dtype=torch.int64, generator=g).tolist()
            rest = self.num_samples % 32
            yield from torch.randint(high=n, size=(rest,), dtype=torch.int64, generator=g).tolist()
            self.epoch += 1
            return
        for _ in range(self.num_samples // n):
            yield from torch.randperm(n, generator=g).tolist()
        yield from torch.randperm(n, generator=g).tolist()[: self.num_samples % n]
        # A finished pass moves on to the next epoch's order, as Accelerate's sampler does
        # (a plain DataLoader never calls set_epoch; prepared loaders set it every epoch anyway).
        self.epoch += 1

    def __len__(self) -> int:
        return self.num_samples


class BatchSamplerShard(Sampler[list[int]]):
    """This rank's batches out of a batch sampler.

    `split_batches=False`: batches are dealt round-robin, rank r takes batch r of each
    round of `num_processes` batches. `split_batches=True`: every batch is split in
    `num_processes` equal slices. With `even_batches`, the last round is padded with the
    epoch's first samples so all ranks get full, equal batches, and `remainder` records how
    many samples of that round are real. With the batch sampler's `drop_last` an
    incomplete last round is dropped.

    `len()` is exact except in one case: `split_batches` without `even_batches` over a batch
    sampler that has no sized `sampler`, whose short last batch may hold nothing for the
    later ranks; it is then counted for every rank.
    """

    def __init__(
        self,
        batch_sampler: Any,
        *,
        num_processes: int,
        process_index: int,
        split_batches: bool = False,
        even_batches: bool = True,
        batch_size: int | None = None,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        size = batch_size if batch_size is not None else getattr(batch_sampler, "batch_size", None)
        if size is None:
            raise ValueError(
                "Cannot shard a batch sampler without a `batch_size` attribute: give the batch sampler a "
                "`batch_size` or prepare the DataLoader with a plain batch size."
            )
        self.batch_size: int = int(size)
        if split_batches and self.batch_size % num_processes != 0:
            raise ValueError(
                f"To use a `DataLoader` in `split_batches` mode, the batch size ({self.batch_size}) needs to be "
                f"a round multiple of the number of processes ({num_processes})."
            )
        self.remainder = -1
        self.skip_batches = 0
        self._primed: Iterator[Any] | None = None
        self._running = False

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def drop_last(self) -> bool:
        return bool(getattr(self.batch_sampler, "drop_last", False))

    def set_epoch(self, epoch: int) -> None:
        for obj in (self.batch_sampler, self.sampler):
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)

    @property
    def total_batch_size(self) -> int:
        return int(self.batch_size) if self.split_batches else int(self.batch_size) * self.num_processes

    def __len__(self) -> int:
        n = len(self.batch_sampler)
        if self.split_batches:
            if self.even_batches or self.drop_last:
                return n
            # Unpadded, a short last batch may hold nothing for the later ranks.
            tail = self._tail()
            return n - 1 if 0 < tail <= self.process_index * (self.batch_size // self.num_processes) else n
        if self.drop_last:
            return n // self.num_processes
        if self.even_batches:
            return math.ceil(n / self.num_processes)
        return n // self.num_processes + (1 if self.process_index < n % self.num_processes else 0)

    def _tail(self) -> int:
        """Samples in the short last batch (0 if none, or unknown without a sized sampler)."""
        try:
            return len(self.sampler) % self.batch_size
        except TypeError:
            return 0

    def prime(self) -> None:
        """Start the wrapped batch sampler now, so the random draws its start makes happen here.

        For an iteration already created but not started (a resumed epoch replays those
        draws from saved generator states, then puts the global generator back). Does
        nothing once the iteration runs (loader workers start it at once).
        """
        if self._running or self._primed is not None:
            return
        inner = iter(self.batch_sampler)
        try:
            first = next(inner)
        except StopIteration:
            self._primed = iter(())
            return
        self._primed = itertools.chain([first], inner)

    def _inner(self) -> Iterator[Any]:
        primed, self._primed = self._primed, None
        return primed if primed is not None else iter(self.batch_sampler)

    def __iter__(self) -> Iterator[list[int]]:
        self.remainder = -1
        self._running = True
        try:
            it = self._iter_split() if self.split_batches else self._iter_rounds()
            for i, batch in enumerate(it):
                if i >= self.skip_batches:
                    yield batch
        finally:
            self._running = False

    def _iter_split(self) -> Iterator[list[int]]:
        size, w, r = int(self.batch_size), self.num_processes, self.process_index
        per = size // w
        head: list[int] = []
        for batch in self._inner():
            batch = list(batch)
            if len(head) < size:
                head.extend(batch[: size - len(head)])
            if len(batch) < size:
                if not self.even_batches:
                    part = batch[r * per : (r + 1) * per]
                    if part:
                        yield part
                    continue
                self.remainder = len(batch)
                batch = batch + cycle_pad(head, size - len(batch))
            else:
                self.remainder = 0
            yield batch[r * per : (r + 1) * per]

    def _iter_rounds(self) -> Iterator[list[int]]:
        size, w, r = int(self.batch_size), self.num_processes, self.process_index
        head: list[int] = []
        round_: list[list[int]] = []
        for batch in self._inner():
            batch = list(batch)
            if len(head) < size * w:
                head.extend(batch[: size * w - len(head)])
            round_.append(batch)
            if len(round_) > w:
                # A short batch that was not the last (a variable-size batch sampler): deal on.
                yield round_[r]
                round_ = round_[w:]
            if len(round_) == w and len(batch) == size:
                yield round_[r]
                round_ = []
                self.remainder = 0
        # drop_last drops the incomplete last round as Accelerate does: every rank's
        # batches are then full and nothing is padded.
        if not round_ or self.drop_last:
            return
        if not self.even_batches:
            self.remainder = -1
            if r < len(round_):
                yield round_[r]
            return
        flat = [i for b in round_ for i in b]
        self.remainder = len(flat)
        flat += cycle_pad(head, size * w - len(flat))
        yield flat[r * size : (r + 1) * size]
