"""Prepared data loaders: every rank its share, the same shuffle everywhere, exact ends.

`prepare_data_loader` picks how the data is split:

- map-style datasets: a `BatchSamplerShard` deals the user's batches to the ranks
  (`accel.data.samplers`). Shuffling is Accelerate's by default: the loader's
  `RandomSampler` gets a generator seeded from the global one at prepare time, and rank 0's
  state of it is copied to every rank at the start of every iteration (`rng_types`,
  `accel.distributed.rng`), so the same script and seed give the same numbers under both libraries.
  With `use_seedable_sampler=True` a `SeedableRandomSampler` draws from a seed fixed at
  prepare time plus the epoch instead, with no collective per epoch;
- iterable datasets: an `IterableDatasetShard` keeps this rank's slice of every round of
  the stream (`accel.data.iterable`);
- `dispatch_batches`: rank 0 reads and sends every rank its slice (`accel.data.dispatch`).

All three give a `DataLoaderShard`. With `even_batches` the last round is filled with
samples from the start of the epoch so every rank runs the same number of equally sized
steps; the loader knows how many samples of that round are real (`remainder`) and
`gather_for_metrics` drops exactly the others. Resume: `skip_first_batches` or
`DataLoaderConfiguration(use_stateful_dataloader=True)` (see `DataLoaderShard.state_dict`).
Resume is exact under both shuffling modes: a loader records the generator states it
starts each epoch from and a resumed epoch starts from those, not from where the global
generator stands at the checkpoint (Accelerate redraws there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from ..distributed import ops
from .dispatch import DataLoaderDispatcher
from .iterable import IterableDatasetShard
from .samplers import BatchSamplerShard, SeedableRandomSampler, shuffle_must_agree
from .shard import DataLoaderShard, skip_first_batches

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
    """Build this rank's prepared loader from a user's `DataLoader` (Accelerate's signature).

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
    # When dispatching, the loader draws its worker seeds from a generator of its own, reseeded
    # per epoch; otherwise (the seedable sampler included, transformers' Trainer's default) it
    # draws them from the global generator, as Accelerate's loaders do: that draw moves the
    # global RNG, so dropout masks match Accelerate's only if it happens here too. Exact
    # resume does not need the private generator: the epoch-start state is saved with the loader.
    owns_generator = kwargs["generator"] is None and dispatch
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
            dataloader, seed_value, use_seedable_sampler, shuffle_must_agree(num_processes) and not dispatch
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
        from ..distributed.state import PartialState

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
    # Accelerate's default: the seed `set_seed` gave torch; rank 0's, so ranks seeded
    # apart (or not at all) still shuffle alike.
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
    `RandomSampler` without a generator one seeded from the global generator, as Accelerate
    does (on the user's sampler object itself, so the same draws happen).
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


# `accel.data.DataLoaderDispatcher` and `accel.data.skip_first_batches`, where Accelerate's users look for them.
__all__ = ["DataLoaderDispatcher", "DataLoaderShard", "prepare_data_loader", "skip_first_batches"]
