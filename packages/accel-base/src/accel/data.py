"""Sharded data loaders: every rank its share, the same shuffle everywhere, exact ends.

A prepared loader is a `DataLoaderShard` (a `torch.utils.data.DataLoader`) whose batch
sampler is a `BatchSamplerShard` over the user's own batch sampler. Shuffling uses a
`SeedableRandomSampler`: a seed fixed at prepare time plus the epoch, so every rank draws
the same order without a collective per epoch, and the order changes every epoch.

With `even_batches` the last round of batches is filled with samples from the start of
the epoch so every rank runs the same number of equally sized steps; the loader knows how
many samples of that round are real (`remainder`) and `gather_for_metrics` drops exactly
the others.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler

from .ops import send_to_device

_LOADER_ATTRS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
)


class SeedableRandomSampler(Sampler[int]):
    """A random permutation drawn from `seed` and the epoch: identical on every rank.

    `set_epoch(e)` selects the permutation; the same (seed, epoch) always gives the same one.
    """

    def __init__(
        self, data_source: Sized, *, seed: int, replacement: bool = False, num_samples: int | None = None
    ) -> None:
        self.data_source = data_source
        self.seed = int(seed)
        self.replacement = replacement
        self._num_samples = num_samples
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        return self._num_samples if self._num_samples is not None else len(self.data_source)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        n = len(self.data_source)
        if self.replacement:
            yield from torch.randint(high=n, size=(self.num_samples,), dtype=torch.int64, generator=g).tolist()
            return
        order: list[int] = []
        while len(order) < self.num_samples:
            order.extend(torch.randperm(n, generator=g).tolist())
        yield from order[: self.num_samples]

    def __len__(self) -> int:
        return self.num_samples


class BatchSamplerShard(Sampler[list[int]]):
    """This rank's batches out of a batch sampler.

    `split_batches=False`: batches are dealt round-robin, rank r takes batch r of each
    round of `num_processes` batches. `split_batches=True`: every batch is split in
    `num_processes` equal slices. With `even_batches`, the last round is padded with the
    epoch's first samples so all ranks get full, equal batches, and `remainder` records how
    many samples of that round are real.
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
            return n
        if self.even_batches:
            return math.ceil(n / self.num_processes)
        return n // self.num_processes + (1 if self.process_index < n % self.num_processes else 0)

    def __iter__(self) -> Iterator[list[int]]:
        self.remainder = -1
        it = self._iter_split() if self.split_batches else self._iter_rounds()
        for i, batch in enumerate(it):
            if i >= self.skip_batches:
                yield batch

    def _iter_split(self) -> Iterator[list[int]]:
        size, w, r = int(self.batch_size), self.num_processes, self.process_index
        per = size // w
        head: list[int] = []
        for batch in self.batch_sampler:
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
                batch = batch + _cycle(head, size - len(batch))
            else:
                self.remainder = 0
            yield batch[r * per : (r + 1) * per]

    def _iter_rounds(self) -> Iterator[list[int]]:
        size, w, r = int(self.batch_size), self.num_processes, self.process_index
        head: list[int] = []
        round_: list[list[int]] = []
        for batch in self.batch_sampler:
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
        if not round_:
            return
        if not self.even_batches:
            self.remainder = -1
            if r < len(round_):
                yield round_[r]
            return
        flat = [i for b in round_ for i in b]
        self.remainder = len(flat)
        flat += _cycle(head, size * w - len(flat))
        yield flat[r * size : (r + 1) * size]


def _cycle(pool: list[int], count: int) -> list[int]:
    if count <= 0:
        return []
    if not pool:
        raise ValueError("Cannot pad the last batch of an empty dataset.")
    return [pool[i % len(pool)] for i in range(count)]


class DataLoaderShard(DataLoader):  # type: ignore[type-arg]
    """A prepared data loader: this rank's batches, on the device, with end-of-loader tracking.

    Iterating it again starts the next epoch (`set_epoch` is called for you); call
    `set_epoch(e)` to choose. While the last batch of an epoch is in use,
    `end_of_dataloader` is True and `remainder` says how many samples of the final round
    are real.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_sampler: BatchSamplerShard,
        device: torch.device | None,
        non_blocking: bool = False,
        gradient_state: Any = None,
        total_dataset_length: int | None = None,
        stateful: bool = False,
        seed: int = 0,
        owns_generator: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.device = device
        self.non_blocking = non_blocking
        self.gradient_state = gradient_state
        self.total_dataset_length = total_dataset_length
        self.stateful = stateful
        self.end_of_dataloader = False
        self.remainder = -1
        self.epoch = 0
        self._next_epoch = 0
        self.batches_yielded = 0
        self._resume_skip = 0
        self.seed = seed
        self._owns_generator = owns_generator

    @property
    def total_batch_size(self) -> int:
        return self.batch_sampler.total_batch_size  # type: ignore[union-attr]

    @property
    def split_batches(self) -> bool:
        return bool(self.batch_sampler.split_batches)  # type: ignore[union-attr]

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch` (its shuffle order) for the next iteration."""
        self._next_epoch = int(epoch)
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler: BatchSamplerShard = self.batch_sampler  # type: ignore[assignment]
        self.epoch = self._next_epoch
        self._next_epoch = self.epoch + 1
        sampler.set_epoch(self.epoch)
        if self._owns_generator and self.generator is not None:
            # DataLoader draws worker seeds from this generator at every iteration; a
            # generator of its own, reseeded per epoch, keeps that draw off the global RNG,
            # so a resumed run consumes random numbers exactly like an uninterrupted one.
            self.generator.manual_seed(self.seed + self.epoch)
        sampler.skip_batches, self._resume_skip = self._resume_skip, 0
        self.batches_yielded = sampler.skip_batches
        self.end_of_dataloader = False
        self.remainder = -1
        if self.gradient_state is not None:
            self.gradient_state._add_dataloader(self)
        try:
            it = super().__iter__()
            try:
                current = next(it)
            except StopIteration:
                self.end_of_dataloader = True
                return
            while True:
                try:
                    upcoming = next(it)
                except StopIteration:
                    self.end_of_dataloader = True
                    self.remainder = sampler.remainder
                    self.batches_yielded += 1
                    yield self._place(current)
                    break
                self.batches_yielded += 1
                yield self._place(current)
                current = upcoming
        finally:
            sampler.skip_batches = 0
            if self.gradient_state is not None:
                self.gradient_state._remove_dataloader(self)

    def _place(self, batch: Any) -> Any:
        if self.device is None:
            return batch
        return send_to_device(batch, self.device, non_blocking=self.non_blocking)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: epoch, batches already yielded in it, the shuffle seed."""
        sampler = self.batch_sampler.sampler  # type: ignore[union-attr]
        finished = self.end_of_dataloader and self.batches_yielded >= len(self)
        return {
            "epoch": self.epoch + (1 if finished else 0),
            "batches_yielded": 0 if finished else self.batches_yielded,
            "seed": getattr(sampler, "seed", None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back to the saved epoch (same shuffle order); with `stateful`, to the saved batch too."""
        self.set_epoch(int(state["epoch"]))
        sampler = self.batch_sampler.sampler  # type: ignore[union-attr]
        if state.get("seed") is not None and isinstance(sampler, SeedableRandomSampler):
            sampler.seed = int(state["seed"])
        self._resume_skip = int(state["batches_yielded"]) if self.stateful else 0
        self.batches_yielded = int(state["batches_yielded"])


def skip_first_batches(dataloader: DataLoaderShard, num_batches: int = 0) -> DataLoaderShard:
    """The same loader, set to skip the first `num_batches` batches of its current epoch once.

    Use it after `load_state` to resume mid-epoch: the skipped batches are the ones the
    interrupted run already saw in that epoch (same shuffle order), and later epochs are
    complete again. Returns `dataloader` itself.
    """
    if not isinstance(dataloader, DataLoaderShard):
        raise TypeError("skip_first_batches needs a data loader returned by `Accelerator.prepare`.")
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}.")
    dataloader._next_epoch = dataloader.epoch
    dataloader._resume_skip = int(num_batches)
    return dataloader


def prepare_data_loader(
    dataloader: DataLoader,  # type: ignore[type-arg]
    *,
    device: torch.device | None,
    num_processes: int,
    process_index: int,
    split_batches: bool = False,
    even_batches: bool = True,
    seed: int,
    use_seedable_sampler: bool = True,
    non_blocking: bool = False,
    gradient_state: Any = None,
    stateful: bool = False,
    extra_kwargs: dict[str, Any] | None = None,
) -> DataLoaderShard:
    """Build this rank's `DataLoaderShard` from a user's map-style `DataLoader`."""
    if isinstance(dataloader.dataset, IterableDataset):
        raise NotImplementedError(
            "Iterable datasets are not supported by this version of prepare; use a map-style dataset."
        )
    if dataloader.batch_sampler is None:
        raise ValueError(
            "prepare needs a DataLoader that batches (batch_size or batch_sampler set); this one has batch_size=None."
        )
    base_batch_sampler = dataloader.batch_sampler
    if type(base_batch_sampler) is BatchSampler:
        sampler = dataloader.sampler
        if isinstance(sampler, RandomSampler) and use_seedable_sampler:
            sampler = SeedableRandomSampler(
                sampler.data_source, seed=seed, replacement=sampler.replacement, num_samples=sampler._num_samples
            )
        base_batch_sampler = BatchSampler(sampler, dataloader.batch_size or 1, dataloader.drop_last)
    shard = BatchSamplerShard(
        base_batch_sampler,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        even_batches=even_batches,
    )
    kwargs: dict[str, Any] = {name: getattr(dataloader, name) for name in _LOADER_ATTRS}
    if dataloader.num_workers > 0:
        kwargs["prefetch_factor"] = dataloader.prefetch_factor
    owns_generator = kwargs["generator"] is None
    if owns_generator:
        kwargs["generator"] = torch.Generator()
    kwargs.update(extra_kwargs or {})
    try:
        length: int | None = len(dataloader.dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    return DataLoaderShard(
        dataloader.dataset,
        batch_sampler=shard,
        device=device,
        non_blocking=non_blocking,
        gradient_state=gradient_state,
        total_dataset_length=length,
        stateful=stateful,
        seed=seed,
        owns_generator=owns_generator,
        **kwargs,
    )
