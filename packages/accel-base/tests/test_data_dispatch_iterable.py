"""Data splitting on 2 ranks: exact batches per rank, exact gather_for_metrics.

Every rank's batches are compared with a reference built here in plain Python from the
rules (dispatch: rank 0 reads and each rank gets slice r of the step's batch; sharding:
the data is cut into rounds and rank r keeps slice r of each, which for a map-style
dataset is batch r of every round of batches), for map-style datasets (shuffled, custom
sampler, custom batch sampler, custom collate) and iterable ones, dispatched or sharded,
for split_batches, even_batches and drop_last in every combination, several dataset
sizes, two epochs with a new order each, and a resume with `skip_first_batches`. `gather_for_metrics` must return exactly the epoch's real
samples in order, as tensors and as objects (`use_gather_object`).
"""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator, DataLoaderConfiguration
from accel.data.dispatch import DataLoaderDispatcher
from accel.data.iterable import IterableDatasetShard
from conftest import launch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

REFERENCE = '''
import math

def order(n, epoch, shuffle, seed):
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()

def cyc(pool, k):
    return [pool[i % len(pool)] for i in range(k)]

def dispatch_ref(ids, B, W, r, split, even, drop_last):
    """Per step: (this rank's ids, the step's real ids, padded?)."""
    if drop_last:
        ids = ids[: len(ids) // B * B]
    G = B if split else B * W
    if drop_last and not split:
        ids = ids[: len(ids) // G * G]
    steps, head = [], ids[:G]
    for s in range(0, len(ids), G):
        real = ids[s : s + G]
        m = len(real)
        if m % W and even:
            full = real + cyc(head, math.ceil(m / W) * W - m)
            per = len(full) // W
            mine = full[r * per : (r + 1) * per]
        else:
            per, extra = divmod(m, W)
            start = r * per + min(r, extra)
            mine = real[start : start + per + (1 if r < extra else 0)]
        steps.append((mine, real))
    return steps

def iterable_ref(ids, B, W, r, split, even, drop_last):
    """Per batch of this rank: (its ids, the round's real ids)."""
    G = B if split else B * W
    per = B // W if split else B
    out, head = [], ids[:G]
    for s in range(0, len(ids), G):
        real = ids[s : s + G]
        if len(real) < G:
            if drop_last:
                break
            if even:
                real_full = real + cyc(head, G - len(real))
                out.append((real_full[r * per : (r + 1) * per], real))
                continue
        mine = real[r * per : (r + 1) * per]
        if mine:
            out.append((mine, real))
    return out
'''

WORKER = (
    """
import itertools, sys
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset
from accel import Accelerator, DataLoaderConfiguration, skip_first_batches
"""
    + REFERENCE
    + """
SEED = 7

class Stream(IterableDataset):
    # A stream with its own per-epoch shuffle; in dispatch mode only rank 0 may read it.
    def __init__(self, n, shuffle, only_rank0):
        self.n, self.shuffle, self.only_rank0, self.epoch = n, shuffle, only_rank0, 0
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        if self.only_rank0:
            assert dist.get_rank() == 0, "dispatch_batches: a rank other than 0 read the dataset"
        for i in order(self.n, self.epoch, self.shuffle, SEED):
            yield torch.tensor(float(i)), 10 * i

class Reversed(Sampler):
    # A user's sampler with its own per-epoch order; prepare must keep it and call set_epoch.
    def __init__(self, n):
        self.n, self.epoch = n, 0
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        return iter(order(self.n, self.epoch, True, SEED)[::-1])
    def __len__(self):
        return self.n

class Chunks(Sampler):
    # A user's batch sampler (fixed batch size, drop_last as asked).
    def __init__(self, n, batch_size, drop_last):
        self.n, self.batch_size, self.drop_last, self.epoch = n, batch_size, drop_last, 0
    def set_epoch(self, epoch):
        self.epoch = epoch
    def __iter__(self):
        ids = order(self.n, self.epoch, True, SEED)
        for s in range(0, self.n, self.batch_size):
            if not self.drop_last or s + self.batch_size <= self.n:
                yield ids[s : s + self.batch_size]
    def __len__(self):
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

def as_dict(samples):
    # A user's collate: a dict batch, to check that nests survive sharding and dispatch.
    return {"x": torch.stack([s[0] for s in samples]), "y": torch.stack([s[1] for s in samples])}

acc = Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=SEED, use_seedable_sampler=True))
W, r = acc.num_processes, acc.process_index
B = 4
checked = 0
MODES = ("dispatch-map", "dispatch-stream", "shard-stream", "shard-map", "shard-map-sampler", "shard-map-batch-sampler")
for mode, split, even, drop_last, n in itertools.product(MODES, (False, True), (True, False), (False, True), (3, 13, 16)):
    cfg = acc.dataloader_config
    cfg.split_batches, cfg.even_batches, cfg.dispatch_batches = split, even, mode.startswith("dispatch")
    shuffle = True
    ids = torch.arange(n)
    table = TensorDataset(ids.float(), ids * 10)
    if mode in ("dispatch-map", "shard-map"):
        user = DataLoader(table, batch_size=B, shuffle=shuffle, drop_last=drop_last, collate_fn=as_dict)
    elif mode == "shard-map-sampler":
        user = DataLoader(table, batch_size=B, sampler=Reversed(n), drop_last=drop_last)
    elif mode == "shard-map-batch-sampler":
        user = DataLoader(table, batch_sampler=Chunks(n, B, drop_last))
    else:
        user = DataLoader(Stream(n, shuffle, mode == "dispatch-stream"), batch_size=B, drop_last=drop_last)
    dl = acc.prepare(user)
    expected_type = "DataLoaderDispatcher" if mode.startswith("dispatch") else "DataLoaderShard"
    assert type(dl).__name__ == expected_type, type(dl)
    tag = (mode, split, even, drop_last, n)
    epochs = []
    for epoch in range(2):
        ids_epoch = order(n, epoch, shuffle, SEED)
        if mode == "shard-map-sampler":
            ids_epoch = ids_epoch[::-1]
        if mode.startswith("dispatch"):
            ref = dispatch_ref(ids_epoch, B, W, r, split, even, drop_last)
        else:
            ref = iterable_ref(ids_epoch, B, W, r, split, even, drop_last)
        got, gathered, gathered_obj = [], [], []
        for step, batch in enumerate(dl):
            x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
            assert torch.equal(y, (x * 10).long()), (tag, "features and labels stay paired")
            got.append(x.long().tolist())
            # Every rank runs the same steps here unless batches are uneven by design.
            if even or mode.startswith("dispatch"):
                obj = acc.gather_for_metrics(x.long().tolist(), use_gather_object=True)
                gathered_obj.extend(obj)
                if even:
                    gathered.extend(acc.gather_for_metrics(x).long().tolist())
        assert got == [mine for mine, _ in ref], (tag, epoch, r, got, ref)
        # A batch sampler without a sized `sampler` does not say how short its last batch is: unpadded
        # and split, len() cannot know whether this rank gets part of it (documented in BatchSamplerShard).
        if "map" in mode and not (mode == "shard-map-batch-sampler" and split and not even):
            assert len(dl) == len(ref), (tag, len(dl), len(ref))
        real = [i for _, step_real in ref for i in step_real]
        # Exact: every real sample of the epoch once, in order; padding gone (count and content).
        if even:
            assert gathered == real, (tag, epoch, gathered, real)
        if even or mode.startswith("dispatch"):
            assert gathered_obj == real, (tag, epoch, gathered_obj, real)
        epochs.append(got)
        checked += 1
    if n > B * W:
        assert epochs[0] != epochs[1], (tag, "a new order every epoch")
    # Resume mid-epoch: skip what was seen of epoch 1, the rest is exactly the same.
    if len(epochs[1]) > 1:
        rest = [(b["x"] if isinstance(b, dict) else b[0]).long().tolist() for b in skip_first_batches(dl, 1)]
        assert dl.epoch == 1 and rest == epochs[1][1:], (tag, rest, epochs[1])
print(f"rank {r}: {checked} epochs exact", flush=True)
"""
)


class _Stream(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.fixture(autouse=True)
def _reference_helpers() -> None:
    exec(REFERENCE, globals())


def test_reference_rules_by_hand() -> None:
    """The reference itself, on cases small enough to check by eye."""
    dispatch_ref, iterable_ref = globals()["dispatch_ref"], globals()["iterable_ref"]
    ids = list(range(10))
    # 2 ranks, batch 4: steps of 8; the last step (8, 9) splits one each.
    assert [s[0] for s in dispatch_ref(ids, 4, 2, 0, False, True, False)] == [[0, 1, 2, 3], [8]]
    assert [s[0] for s in dispatch_ref(ids, 4, 2, 1, False, True, False)] == [[4, 5, 6, 7], [9]]
    # 9 samples: the last step (8) is completed with sample 0 for rank 1.
    assert [s[0] for s in dispatch_ref(ids[:9], 4, 2, 1, False, True, False)] == [[4, 5, 6, 7], [0]]
    assert [s[0] for s in dispatch_ref(ids[:9], 4, 2, 1, False, False, False)] == [[4, 5, 6, 7], []]
    # Iterable: rounds of 8; the short round (8, 9) is padded with 0..5 under even_batches.
    assert [s[0] for s in iterable_ref(ids, 4, 2, 1, False, True, False)] == [[4, 5, 6, 7], [2, 3, 4, 5]]
    assert [s[0] for s in iterable_ref(ids, 4, 2, 1, False, False, False)] == [[4, 5, 6, 7]]
    assert [s[0] for s in iterable_ref(ids, 4, 2, 0, False, False, False)] == [[0, 1, 2, 3], [8, 9]]


def test_one_process_keeps_the_short_last_batch() -> None:
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    dl = acc.prepare(DataLoader(_Stream(10), batch_size=4))
    assert isinstance(dl._shard, IterableDatasetShard)
    assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    dl = acc.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=4))
    assert [b.tolist() for (b,) in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_iterable_datasets_dispatch_by_default_and_yield_whole_batches() -> None:
    acc = Accelerator()
    dl = acc.prepare(DataLoader(_Stream(10), batch_size=4))
    assert isinstance(dl, DataLoaderDispatcher)
    assert [b.tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # A dataset that yields whole batches (batch_size=None) can only be dispatched.
    batches = DataLoader([torch.arange(3), torch.arange(3, 5)], batch_size=None)
    acc.dataloader_config.dispatch_batches = True
    assert [b.tolist() for b in acc.prepare(batches)] == [[0, 1, 2], [3, 4]]


def test_iterable_sharding_with_workers_is_refused() -> None:
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=False))
    with pytest.raises(ValueError, match=r"every worker would read the whole stream.*dispatch_batches=True"):
        acc.prepare(DataLoader(_Stream(10), batch_size=4, num_workers=1))
    with pytest.raises(ValueError, match="needs to be a round multiple of the number of processes"):
        IterableDatasetShard(_Stream(10), batch_size=3, num_processes=2, process_index=0, split_batches=True)


def test_two_ranks_exact_batches_and_gather_for_metrics(write_script) -> None:
    proc = launch(write_script(WORKER), timeout=480)
    for rank in (0, 1):
        assert f"rank {rank}: 288 epochs exact" in proc.stdout, proc.stdout[-3000:]


def test_drop_last_drops_an_incomplete_round_of_full_batches() -> None:
    from accel.data.loader import BatchSamplerShard
    from torch.utils.data import BatchSampler, SequentialSampler

    # 12 samples, batches of 4, 2 ranks: the third batch has no partner; drop_last drops it
    # (as Accelerate does) instead of padding the round.
    for rank, expected in ((0, [[0, 1, 2, 3]]), (1, [[4, 5, 6, 7]])):
        base = BatchSampler(SequentialSampler(range(12)), 4, drop_last=True)
        shard = BatchSamplerShard(base, num_processes=2, process_index=rank)
        assert list(shard) == expected and len(shard) == 1
