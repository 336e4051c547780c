"""The prepared data loader itself: this rank's batches, on the device, with end-of-loader tracking.

`accel.data.prepare_data_loader` builds one (`accel.data.dispatch.DataLoaderDispatcher` is
the variant where rank 0 reads and sends); both import it from here, so neither imports the other.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..distributed.ops import send_to_device
from ..distributed.rng import synchronize_rng_states
from .samplers import SeedableRandomSampler


class DataLoaderShard(DataLoader):  # type: ignore[type-arg]
    """A prepared data loader: this rank's batches, on the device, with end-of-loader tracking.

    Iterating it again starts the next epoch (`set_epoch` is called for you); call
    `set_epoch(e)` to choose. While the last batch of an epoch is in use,
    `end_of_dataloader` is True and `remainder` says how many samples of the final round
    are real. `shard` is what splits the data: a `BatchSamplerShard` (map-style datasets)
    or an `IterableDatasetShard`; both take `set_epoch`, `skip_batches` and report `remainder`.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        shard: Any,
        device: torch.device | None,
        non_blocking: bool = False,
        gradient_state: Any = None,
        total_dataset_length: int | None = None,
        stateful: bool = False,
        seed: int = 0,
        owns_generator: bool = False,
        batch_transfer: Callable[[Iterator[Any], torch.device], Iterable[Any]] | None = None,
        rng_types: list[str] | None = None,
        synchronized_generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, **kwargs)
        self.rng_types = rng_types
        """Generators copied from rank 0 at the start of every iteration (`accel.distributed.rng`)."""
        self.synchronized_generator = synchronized_generator
        """The generator `"generator"` in `rng_types` names: the shuffling sampler's."""
        self._epoch_rng: dict[str, torch.Tensor] | None = None
        self._resume_rng: dict[str, torch.Tensor] | None = None
        self._shard = shard
        self.device = device
        self.batch_transfer = batch_transfer
        """The adapter's device loader (`batch_transfer(batches, device)`), which places batches
        itself (e.g. prefetching them in the background); None: each batch is moved on its own."""
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
        return int(self._shard.total_batch_size)

    @property
    def split_batches(self) -> bool:
        return bool(self._shard.split_batches)

    @property
    def even_batches(self) -> bool:
        return bool(self._shard.even_batches)

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self._shard.even_batches = value

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch` (its shuffle order) for the next iteration."""
        self._next_epoch = int(epoch)
        self.epoch = int(epoch)

    def _raw_batches(self) -> Iterator[Any]:
        """This rank's batches of the epoch, before placement."""
        return super().__iter__()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        shard = self._shard
        self.epoch = self._next_epoch
        self._next_epoch = self.epoch + 1
        shard.set_epoch(self.epoch)
        if self._owns_generator and self.generator is not None:
            # DataLoader draws worker seeds from this generator at every iteration; a
            # generator of its own, reseeded per epoch, keeps that draw off the global RNG,
            # so a resumed run consumes random numbers exactly like an uninterrupted one.
            self.generator.manual_seed(self.seed + self.epoch)
        shard.skip_batches, self._resume_skip = self._resume_skip, 0
        resume_rng, self._resume_rng = (self._resume_rng if shard.skip_batches else None), None
        self.batches_yielded = shard.skip_batches
        self.end_of_dataloader = False
        self.remainder = -1
        if self.gradient_state is not None:
            self.gradient_state.add_dataloader(self)
        try:
            it = self._start(resume_rng)
            if self.batch_transfer is not None and self.device is not None:
                # It may read ahead; the end-of-loader lookahead below then works on what it
                # hands out, so `end_of_dataloader` still flips with the last batch in use.
                it = iter(self.batch_transfer(it, self.device))
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
                    self.remainder = shard.remainder
                    self.batches_yielded += 1
                    yield self._place(current)
                    break
                self.batches_yielded += 1
                yield self._place(current)
                current = upcoming
        finally:
            shard.skip_batches = 0
            if self.gradient_state is not None:
                self.gradient_state.remove_dataloader(self)

    def _epoch_generators(self) -> dict[str, torch.Generator | None]:
        """The generators an epoch's start draws from: sampler (shuffle) and loader (worker seeds)."""
        gens: dict[str, torch.Generator | None] = {}
        if self.synchronized_generator is not None:
            gens["generator"] = self.synchronized_generator
        if not self._owns_generator:
            # None: the loader draws its worker base seed from the global generator.
            gens["loader"] = self.generator
        return gens

    def epoch_rng_sizes(self) -> dict[str, int]:
        """Bytes of each generator state `state_dict()["epoch_rng"]` holds (what a resumed epoch restores)."""
        return {
            name: (g.get_state() if g is not None else torch.get_rng_state()).numel()
            for name, g in self._epoch_generators().items()
        }

    def _start(self, resume_rng: dict[str, torch.Tensor] | None) -> Iterator[Any]:
        """Begin an epoch: synchronise `rng_types`, then create the batch iterator.

        A resumed epoch (`resume_rng`, saved with the checkpoint) instead starts every
        generator it draws from in the state the interrupted epoch started from; the global
        generator is swapped in only for those draws, so it continues from the checkpoint.
        """
        gens = self._epoch_generators()
        if resume_rng is None:
            if self.rng_types:
                synchronize_rng_states(self.rng_types, self.synchronized_generator)
            self._epoch_rng = {
                name: (g.get_state() if g is not None else torch.get_rng_state()) for name, g in gens.items()
            }
            return self._raw_batches()
        self._epoch_rng = resume_rng
        global_state = None
        for name, g in gens.items():
            if name not in resume_rng:
                continue
            if g is not None:
                g.set_state(resume_rng[name])
            elif global_state is None:
                global_state = torch.get_rng_state()
                torch.set_rng_state(resume_rng[name])
        try:
            it = self._raw_batches()
            prime = getattr(self._shard, "prime", None)
            if prime is not None:
                prime()
        finally:
            if global_state is not None:
                torch.set_rng_state(global_state)
        return it

    def _place(self, batch: Any) -> Any:
        if self.device is None or self.batch_transfer is not None:
            return batch
        return send_to_device(batch, self.device, non_blocking=self.non_blocking)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: epoch, batches already yielded in it, the shuffle seed."""
        # end_of_dataloader stays True after the last batch: the epoch is done, resume in the next.
        finished = self.end_of_dataloader
        state: dict[str, Any] = {
            "epoch": self.epoch + (1 if finished else 0),
            "batches_yielded": 0 if finished else self.batches_yielded,
            "seed": getattr(self._shard.sampler, "seed", None),
        }
        if state["batches_yielded"] == 0:
            # At an epoch boundary (or before the first batch) the next epoch starts from the generators'
            # states now: the sampler's generator has moved on by this epoch's shuffle, and a resumed
            # loader's would otherwise start over from where it was seeded. The global generator is left
            # out: the checkpoint's RNG state restores it, and the draws until the next epoch follow.
            rng = {name: g.get_state() for name, g in self._epoch_generators().items() if g is not None}
        else:
            # The generator states this epoch started from, for an exact mid-epoch resume.
            rng = self._epoch_rng or {}
        if rng:
            state["epoch_rng"] = {
                name: base64.b64encode(t.numpy().tobytes()).decode("ascii") for name, t in rng.items()
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go back to the saved epoch (same shuffle order); with `stateful`, to the saved batch too."""
        self.set_epoch(int(state["epoch"]))
        sampler = self._shard.sampler
        if state.get("seed") is not None and isinstance(sampler, SeedableRandomSampler):
            sampler.seed = int(state["seed"])
        self._resume_skip = int(state["batches_yielded"]) if self.stateful else 0
        self.batches_yielded = int(state["batches_yielded"])
        saved = {
            name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
            for name, text in (state.get("epoch_rng") or {}).items()
        }
        if self.batches_yielded == 0:
            # Saved at an epoch boundary: the next epoch's generators start where they stood.
            for name, g in self._epoch_generators().items():
                if g is not None and name in saved:
                    g.set_state(saved[name])
            saved = {}
        self._resume_rng = saved or None


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
