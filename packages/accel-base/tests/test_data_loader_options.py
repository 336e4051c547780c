"""Prepared-loader options: data_seed, set_epoch, non_blocking, the stateful position, skip_first_batches."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from accel import Accelerator, DataLoaderConfiguration, set_seed, skip_first_batches
from accel.state import AcceleratorState, GradientState
from torch.utils.data import DataLoader, TensorDataset

N, BATCH = 23, 4


def _loader(**config: Any) -> Any:
    # These tests are about `data_seed`, which only the seedable sampler reads.
    config.setdefault("use_seedable_sampler", True)
    AcceleratorState._reset_state()
    GradientState._reset_state()
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(**config))
    return acc.prepare(DataLoader(TensorDataset(torch.arange(N)), batch_size=BATCH, shuffle=True))


def _epoch(dl: Any) -> list[list[int]]:
    return [b.tolist() for (b,) in dl]


def test_data_seed_fixes_the_order_and_set_seed_controls_the_default() -> None:
    a, b, c = _loader(data_seed=5), _loader(data_seed=5), _loader(data_seed=6)
    first = [_epoch(a), _epoch(a)]
    assert first == [_epoch(b), _epoch(b)], "same data_seed, same order every epoch"
    assert first[0] != first[1], "a new order every epoch"
    assert _epoch(c) != first[0]
    assert sorted(i for batch in first[0] for i in batch) == list(range(N))
    set_seed(1)
    d = _epoch(_loader())
    set_seed(1)
    e = _epoch(_loader())
    set_seed(2)
    f = _epoch(_loader())
    assert d == e != f


def test_set_epoch_selects_that_epochs_order() -> None:
    dl = _loader(data_seed=0)
    orders = [_epoch(dl) for _ in range(4)]
    other = _loader(data_seed=0)
    other.set_epoch(3)
    assert _epoch(other) == orders[3]
    assert other.epoch == 3 and _epoch(other) == _epoch(_after(dl, 4))


def _after(dl: Any, epoch: int) -> Any:
    dl.set_epoch(epoch)
    return dl


def test_non_blocking_reaches_the_transfer() -> None:
    calls: list[dict[str, Any]] = []

    class Batch:
        def __init__(self, ids: list[int]) -> None:
            self.ids = ids

        def to(self, device: torch.device, **kwargs: Any) -> Batch:
            calls.append({"device": device, **kwargs})
            return self

    def collate(samples: list[Any]) -> Batch:
        return Batch([int(s[0]) for s in samples])

    for flag in (True, False):
        calls.clear()
        AcceleratorState._reset_state()
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=flag))
        dl = acc.prepare(DataLoader(TensorDataset(torch.arange(8)), batch_size=4, collate_fn=collate))
        assert [b.ids for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert calls == [{"device": acc.device, "non_blocking": flag}] * 2


@pytest.mark.parametrize("stateful", [True, False])
def test_saved_position_restores_the_epoch_and_with_stateful_the_batch(stateful: bool) -> None:
    dl = _loader(data_seed=0, use_stateful_dataloader=stateful)
    full = [_epoch(dl), _epoch(dl)]
    dl.set_epoch(1)
    seen = []
    for (b,) in dl:
        seen.append(b.tolist())
        if len(seen) == 2:
            state = dl.state_dict()
            break
    # With the default loader the epoch's start also drew the worker seed from the global RNG: its state
    # then is saved too, so a resumed run draws the same.
    assert set(state.pop("epoch_rng")) == {"loader"}
    assert state == {"epoch": 1, "batches_yielded": 2, "seed": 0}
    fresh = _loader(data_seed=99, use_stateful_dataloader=stateful)
    fresh.load_state_dict(state)  # the saved seed replaces the fresh loader's
    if stateful:
        assert _epoch(fresh) == full[1][2:], "iteration continues at the saved batch"
    else:
        assert _epoch(skip_first_batches(fresh, 2)) == full[1][2:], "the saved epoch, its own order"
    assert _epoch(fresh) == _epoch(_after(_loader(data_seed=0), 2)), "then the next epoch, complete"


def test_state_after_a_finished_epoch_points_at_the_next() -> None:
    dl = _loader(data_seed=0, use_stateful_dataloader=True)
    _epoch(dl)
    assert dl.state_dict() == {"epoch": 1, "batches_yielded": 0, "seed": 0}


def test_skip_first_batches_needs_a_prepared_loader() -> None:
    with pytest.raises(TypeError, match=r"needs a data loader returned by `Accelerator\.prepare`"):
        skip_first_batches(DataLoader(TensorDataset(torch.arange(4))), 1)
    with pytest.raises(ValueError, match="num_batches must be >= 0"):
        skip_first_batches(_loader(), -1)


@pytest.mark.parametrize("stateful", [True, False])
def test_default_shuffle_resumes_mid_epoch_exactly_in_one_process(stateful: bool) -> None:
    """Accelerate's shuffle (the loader's RandomSampler drawing from the global generator):
    a loader restored from a mid-epoch state gives the interrupted epoch's order, although the
    global generator has moved on, and leaves the global generator where the resumed run expects it."""
    set_seed(3)
    dl = _loader(use_seedable_sampler=False, use_stateful_dataloader=stateful)
    _epoch(dl)
    seen = []
    for (b,) in dl:
        seen.append(b.tolist())
        if len(seen) == 2:
            state = dl.state_dict()
            rng = torch.get_rng_state()
            break
    set_seed(3)
    reference = _loader(use_seedable_sampler=False)
    orders = [_epoch(reference), _epoch(reference)]
    assert seen == orders[1][:2]
    torch.manual_seed(1234)  # the resumed process: its generator is anywhere until load_state restores it
    fresh = _loader(use_seedable_sampler=False, use_stateful_dataloader=stateful)
    fresh.load_state_dict(state)
    torch.set_rng_state(rng)  # what load_state restores
    resumed = _epoch(fresh if stateful else skip_first_batches(fresh, 2))
    assert resumed == orders[1][2:], "the interrupted epoch's order, from the saved batch"
    assert torch.equal(torch.get_rng_state(), rng), "the epoch's start draws did not consume the restored generator"
