"""Prepared data loaders: every rank its share, the same shuffle everywhere, exact ends.

`prepare_data_loader` picks how the data is split:

- map-style datasets: a `BatchSamplerShard` deals the user's batches to the ranks
  (`accel.data_samplers`). Shuffling is the peer library's by default: the loader's
  `RandomSampler` gets a generator seeded from the global one at prepare time, and rank 0's
  state of it is copied to every rank at the start of every iteration (`rng_types`,
  `accel.rng`), so the same script and seed give the same numbers under both libraries.
  With `use_seedable_sampler=True` a `SeedableRandomSampler` draws from a seed fixed at
  prepare time plus the epoch instead, with no collective per epoch;
- iterable datasets: an `IterableDatasetShard` keeps this rank's slice of every round of
  the stream (`accel.data_iterable`);
- `dispatch_batches`: rank 0 reads and sends every rank its slice (`accel.data_dispatch`).

All three give a `DataLoaderShard`. With `even_batches` the last round is filled with
samples from the start of the epoch so every rank runs the same number of equally sized
steps; the loader knows how many samples of that round are real (`remainder`) and
`gather_for_metrics` drops exactly the others. Resume: `skip_first_batches` or
`DataLoaderConfiguration(use_stateful_dataloader=True)` (see `DataLoaderShard.state_dict`).
Resume is exact under both shuffling modes: a loader records the generator states it
starts each epoch from and a resumed epoch starts from those, not from where the global
generator stands at the checkpoint (the peer library redraws there).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from .data_iterable import IterableDatasetShard
from .data_samplers import BatchSamplerShard, SeedableRandomSampler
from .ops import send_to_device
from .rng import synchronize_rng_states

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
        """Generators copied from rank 0 at the start of every iteration (`accel.rng`)."""
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
            self.gradient_state._add_dataloader(self)
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
                self.gradient_state._remove_dataloader(self)

    def _epoch_generators(self) -> dict[str, torch.Generator | None]:
        """The generators an epoch's start draws from: sampler (shuffle) and loader (worker seeds)."""
        gens: dict[str, torch.Generator | None] = {}
        if self.synchronized_generator is not None:
            gens["generator"] = self.synchronized_generator
        if not self._owns_generator:
            # None: the loader draws its worker base seed from the global generator.
            gens["loader"] = self.generator
        return gens

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
        if not finished and self._epoch_rng:
            # The generator states this epoch started from (JSON-safe), for an exact mid-epoch resume.
            state["epoch_rng"] = {
                name: base64.b64encode(t.numpy().tobytes()).decode("ascii") for name, t in self._epoch_rng.items()
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
        saved = state.get("epoch_rng") or {}
        self._resume_rng = {
            name: torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()
            for name, text in saved.items()
        } or None


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
    device: torch.device | None = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Callable[..., Any] | None = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: Any = None,
    *,
    comm_device: torch.device | None = None,
    seed: int | Callable[[], int] | None = None,
    gradient_state: Any = None,
    stateful: bool | None = None,
    extra_kwargs: dict[str, Any] | None = None,
) -> DataLoaderShard:
    """Build this rank's prepared loader from a user's `DataLoader` (the peer library's signature).

    Map-style datasets are sharded by batch sampler (a `BatchSampler` given as `sampler`
    included), iterable ones by rounds of samples (`IterableDatasetShard`); with
    `dispatch_batches` (the default for iterable datasets when `put_on_device`) rank 0 reads
    and every rank receives its slice (`DataLoaderDispatcher`, communicating on
    `comm_device`, default `device`). `num_processes`/`process_index` default to the
    running processes (the data-parallel ranks of `torch_device_mesh` when one is given).

    Shuffling: by default the loader's `RandomSampler` gets a generator seeded from the
    global one, synchronised from rank 0 at every iteration when `rng_types` contains
    `"generator"`; `use_seedable_sampler=True` shuffles with a `SeedableRandomSampler`
    seeded by `data_seed` (else `seed`, a number or a function giving one, else torch's
    initial seed) plus the epoch. Batches move to `device` only with `put_on_device`.

    The keyword-only arguments are accel's: `gradient_state` (the Accelerator's, for
    end-of-loader tracking), `stateful` (spelling of `use_stateful_dataloader`) and
    `extra_kwargs` (adapter options for the new `DataLoader`).

    Raises:
        ValueError: a loader without batching where it is needed, an iterable dataset
            sharded with worker processes, or a batch size `split_batches` cannot split.
        NotImplementedError: `slice_fn_for_dispatch` (dispatched batches are sliced by accel).
    """
    if slice_fn_for_dispatch is not None:
        raise NotImplementedError(
            "prepare_data_loader(slice_fn_for_dispatch=...) is not supported: accel slices dispatched batches "
            "along their first dimension. Slice inside your collate_fn, or leave dispatch_batches off."
        )
    num_processes, process_index = _data_ranks(num_processes, process_index, torch_device_mesh)
    stateful = use_stateful_dataloader if stateful is None else stateful
    place = device if put_on_device else None
    iterable = isinstance(dataloader.dataset, IterableDataset)
    # One process has nobody to even out with: its short last batch stays short, as with a
    # plain DataLoader (padding would train on repeated samples).
    even_batches = even_batches and num_processes > 1
    if dispatch_batches is None:
        dispatch_batches = iterable and put_on_device
    dispatch = bool(dispatch_batches)
    sampler_is_batch_sampler = isinstance(dataloader.sampler, BatchSampler)
    seed_value = 0
    if use_seedable_sampler:
        seed_value = _resolve_seed(data_seed, seed)
    kwargs: dict[str, Any] = {name: getattr(dataloader, name) for name in _LOADER_ATTRS}
    if dataloader.num_workers > 0:
        kwargs["prefetch_factor"] = dataloader.prefetch_factor
    # Under the seedable sampler (and when dispatching) the loader draws its worker seeds
    # from a generator of its own, reseeded per epoch; by default it draws them from the
    # global generator, as the peer library's loaders do.
    owns_generator = kwargs["generator"] is None and (use_seedable_sampler or dispatch)
    if owns_generator:
        kwargs["generator"] = torch.Generator()
    kwargs.update(extra_kwargs or {})
    try:
        length: int | None = len(dataloader.dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    synchronized: torch.Generator | None = None
    batch_sampler = None
    if not iterable:
        batch_sampler, synchronized = _shuffled_batch_sampler(
            dataloader, seed_value, use_seedable_sampler, num_processes > 1 and not dispatch
        )
    elif not dispatch and num_processes > 1:
        synchronized = getattr(dataloader.dataset, "generator", None)
    rng = [r.value if hasattr(r, "value") else str(r) for r in (rng_types or [])]
    if synchronized is None and "generator" in rng:
        rng.remove("generator")
    common: dict[str, Any] = {
        "device": place,
        "non_blocking": non_blocking,
        "gradient_state": gradient_state,
        "total_dataset_length": length,
        "stateful": stateful,
        "seed": seed_value,
        "owns_generator": owns_generator,
    }
    if dispatch:
        from .data_dispatch import DataLoaderDispatcher  # imports this module

        if batch_sampler is not None:
            kwargs["sampler" if sampler_is_batch_sampler else "batch_sampler"] = batch_sampler
            if sampler_is_batch_sampler:
                kwargs["batch_size"] = None
        else:
            kwargs.update(batch_size=dataloader.batch_size, drop_last=dataloader.drop_last)
            if not iterable:
                kwargs["sampler"] = dataloader.sampler
        return DataLoaderDispatcher(
            dataloader.dataset,
            num_processes=num_processes,
            process_index=process_index,
            split_batches=split_batches,
            even_batches=even_batches,
            comm_device=comm_device if comm_device is not None else (device or torch.device("cpu")),
            **common,
            **kwargs,
        )
    common.update(rng_types=rng or None, synchronized_generator=synchronized)
    if dataloader.batch_size is None and dataloader.batch_sampler is None and not sampler_is_batch_sampler:
        raise ValueError(
            "prepare needs a DataLoader that batches (batch_size or batch_sampler set); this one has batch_size=None. "
            "For a dataset that yields whole batches, use DataLoaderConfiguration(dispatch_batches=True)."
        )
    if iterable:
        if dataloader.num_workers > 0:
            raise ValueError(
                "An iterable dataset is sharded in the main process, and with num_workers > 0 every worker would "
                "read the whole stream. Use DataLoaderConfiguration(dispatch_batches=True) (the default for "
                "iterable datasets: rank 0 reads with its workers and sends each rank its part) or num_workers=0."
            )
        dataset_shard = IterableDatasetShard(
            dataloader.dataset,
            batch_size=int(dataloader.batch_size),  # type: ignore[arg-type]
            num_processes=num_processes,
            process_index=process_index,
            drop_last=dataloader.drop_last,
            even_batches=even_batches,
            split_batches=split_batches,
        )
        # The shard yields whole rounds; the loader only groups them, so it never drops.
        return DataLoaderShard(
            dataset_shard, shard=dataset_shard, batch_size=dataset_shard.process_batch_size, **common, **kwargs
        )
    shard = BatchSamplerShard(
        batch_sampler,
        num_processes=num_processes,
        process_index=process_index,
        split_batches=split_batches,
        even_batches=even_batches,
    )
    if sampler_is_batch_sampler:
        # The dataset takes a whole list of indices per item (batched reads): the shard is the
        # sampler and the loader does not batch again.
        return DataLoaderShard(dataloader.dataset, shard=shard, sampler=shard, batch_size=None, **common, **kwargs)
    return DataLoaderShard(dataloader.dataset, shard=shard, batch_sampler=shard, **common, **kwargs)


def _data_ranks(num_processes: int | None, process_index: int | None, mesh: Any) -> tuple[int, int]:
    """(number of data shards, this process's shard): the running processes, or a mesh's data-parallel ranks."""
    if num_processes is None or process_index is None:
        from .state import PartialState

        state = PartialState()
        num_processes = state.num_processes if num_processes is None else num_processes
        process_index = state.process_index if process_index is None else process_index
    if mesh is not None:
        names = tuple(mesh.mesh_dim_names or ())
        size = {n: mesh[n].size() for n in names}
        # Ranks that hold the same data (tensor/context-parallel peers) share a shard.
        process_index //= size.get("tp", 1) * size.get("cp", 1)
        num_processes = size.get("dp_replicate", 1) * size.get("dp_shard", 1)
    return int(num_processes), int(process_index)


def _resolve_seed(data_seed: int | None, seed: int | Callable[[], int] | None) -> int:
    if data_seed is not None:
        return int(data_seed)
    if callable(seed):
        return int(seed())
    if seed is not None:
        return int(seed)
    # The peer library's default: the seed `set_seed` gave torch; rank 0's, so ranks seeded
    # apart (or not at all) still shuffle alike.
    from . import ops

    return int(ops.broadcast_object_list([int(torch.random.initial_seed())])[0])


def _shuffled_batch_sampler(
    dataloader: DataLoader,  # type: ignore[type-arg]
    seed: int,
    use_seedable: bool,
    synchronize: bool,
) -> tuple[Any, torch.Generator | None]:
    """The loader's batch sampler to shard, and the generator to synchronise per iteration (or None).

    Seedable mode replaces a plain `RandomSampler` by a `SeedableRandomSampler`. Default mode
    keeps the user's sampler and, when several processes must agree on its order, gives a
    `RandomSampler` without a generator one seeded from the global generator, as the peer
    library does (on the user's sampler object itself, so the same draws happen).
    """
    batch_sampling = isinstance(dataloader.sampler, BatchSampler)
    base = dataloader.sampler if batch_sampling else dataloader.batch_sampler
    sampler = getattr(base, "sampler", None)
    if use_seedable:
        if type(base) is BatchSampler and isinstance(sampler, RandomSampler):
            seeded = SeedableRandomSampler(
                sampler.data_source, seed=seed, replacement=sampler.replacement, num_samples=sampler._num_samples
            )
            base = BatchSampler(seeded, base.batch_size, base.drop_last)
        return base, None
    if not synchronize or sampler is None or not hasattr(sampler, "generator"):
        return base, None
    if sampler.generator is None:
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        sampler.generator = generator
    return base, sampler.generator


def __getattr__(name: str) -> Any:
    # `accel.data.DataLoaderDispatcher`, where the peer library's users look for it; imported
    # lazily because that module builds on this one.
    if name == "DataLoaderDispatcher":
        from .data_dispatch import DataLoaderDispatcher

        return DataLoaderDispatcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
