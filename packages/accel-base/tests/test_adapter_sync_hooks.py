"""Hooks around synchronisation: `wait_for_everyone` goes through `Adapter.barrier` (default
`dist.barrier()`), so an adapter whose backend's barrier returns at once can use its runtime's
own; `no_sync` and `accumulate` enter `Strategy.no_sync` (data parallelism, the hardware's own
included, is a strategy's)."""

from __future__ import annotations

import pytest
from accel import Accelerator
from accel.adapter.base import Adapter
from accel.state import PartialState


def test_wait_for_everyone_calls_the_adapters_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = Accelerator()
    calls: list[str] = []
    monkeypatch.setattr(acc.adapter, "barrier", lambda: calls.append("barrier"))
    acc.wait_for_everyone()
    assert calls == []  # one process: nothing to wait for
    monkeypatch.setattr(PartialState, "use_distributed", property(lambda self: True))
    acc.wait_for_everyone()
    with acc.main_process_first():
        pass
    assert calls == ["barrier", "barrier"]


def test_default_barrier_is_torch_distributed(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    calls: list[str] = []
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("dist"))
    Adapter().barrier()
    assert calls == ["dist"]


def test_no_sync_and_accumulate_enter_the_strategys_no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    import torch

    acc = Accelerator(gradient_accumulation_steps=2)
    entered: list[str] = []

    @contextlib.contextmanager
    def no_sync(model: torch.nn.Module):  # type: ignore[no-untyped-def]
        entered.append(type(model).__name__)
        yield

    monkeypatch.setattr(acc.strategy, "no_sync", no_sync)
    model = acc.prepare(torch.nn.Linear(2, 1))
    with acc.no_sync(model):
        pass
    with acc.accumulate(model):  # first micro-batch of 2: no sync
        pass
    with acc.accumulate(model):  # the last one synchronises
        pass
    assert entered == ["Linear", "Linear"]
