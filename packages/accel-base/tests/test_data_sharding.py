"""Sharding: every sample once, equal batches on every rank, padding dropped exactly by gather_for_metrics."""

from __future__ import annotations

import itertools

import pytest
from accel.data.loader import BatchSamplerShard, SeedableRandomSampler
from conftest import launch
from torch.utils.data import BatchSampler, SequentialSampler


def shards(n: int, batch: int, *, split: bool, even: bool, drop_last: bool = False) -> list[list[list[int]]]:
    out = []
    for rank in range(2):
        base = BatchSampler(SequentialSampler(range(n)), batch, drop_last)
        sampler = BatchSamplerShard(base, num_processes=2, process_index=rank, split_batches=split, even_batches=even)
        batches = list(sampler)
        assert len(batches) == len(sampler), "__len__ must match what iteration yields"
        out.append((batches, sampler.remainder))
    return out


@pytest.mark.parametrize(("n", "batch"), list(itertools.product([1, 7, 8, 10, 16, 33], [1, 2, 4])))
@pytest.mark.parametrize("split", [False, True])
def test_even_batches_cover_every_sample_and_remainder_marks_padding(n: int, batch: int, split: bool) -> None:
    if split and batch % 2:
        with pytest.raises(ValueError, match="needs to be a round multiple of the number of processes"):
            shards(n, batch, split=split, even=True)
        return
    (b0, r0), (b1, r1) = shards(n, batch, split=split, even=True)
    assert len(b0) == len(b1)
    per_rank = batch // 2 if split else batch
    assert all(len(b) == per_rank for b in b0 + b1), "even_batches gives full batches everywhere"
    # What gather returns step by step: rank 0's batch then rank 1's.
    gathered = [b0[i] + b1[i] for i in range(len(b0))]
    assert r0 == r1
    if r0 > 0:
        gathered[-1] = gathered[-1][:r0]
    flat = [i for step in gathered for i in step]
    assert flat == list(range(n)), "after dropping the padding every sample appears exactly once, in order"


def test_uneven_batches_do_not_pad() -> None:
    (b0, r0), (b1, _) = shards(10, 4, split=False, even=False)
    assert b0 == [[0, 1, 2, 3], [8, 9]]
    assert b1 == [[4, 5, 6, 7]]
    assert r0 == -1


def test_drop_last_drops_the_short_batch() -> None:
    (b0, _), (b1, _) = shards(10, 4, split=False, even=True, drop_last=True)
    assert b0 == [[0, 1, 2, 3]]
    assert b1 == [[4, 5, 6, 7]]


def test_seedable_sampler_same_seed_same_order_new_epoch_new_order() -> None:
    a, b = SeedableRandomSampler(range(50), seed=3), SeedableRandomSampler(range(50), seed=3)
    first = list(a)
    assert first == list(b)
    assert sorted(first) == list(range(50))
    # A full pass moves on to the next epoch (as Accelerate's sampler does).
    assert a.epoch == 1 and list(a) != first
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != first


WORKER = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator, DataLoaderConfiguration

for split in (False, True):
    for n in (13, 16):
        from accel.state import AcceleratorState, GradientState
        AcceleratorState._reset_state()
        GradientState._reset_state()
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split))
        data = torch.arange(n, dtype=torch.float32)
        dl = acc.prepare(DataLoader(TensorDataset(data), batch_size=4, shuffle=True))
        orders = []
        for epoch in range(2):
            seen = [acc.gather_for_metrics(x) for (x,) in dl]
            got = torch.cat(seen)
            assert sorted(got.tolist()) == data.tolist(), (split, n, epoch, got.tolist())
            orders.append(got.tolist())
        assert orders[0] != orders[1], "the shuffle must change between epochs"
        print(f"ok split={split} n={n}", flush=True)
"""


def test_gather_for_metrics_is_exact_on_two_ranks_with_shuffling(write_script) -> None:
    proc = launch(write_script(WORKER), timeout=240)
    for split in (False, True):
        for n in (13, 16):
            assert f"ok split={split} n={n}" in proc.stdout
