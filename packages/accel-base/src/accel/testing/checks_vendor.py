"""Conformance checks about the adapter's vendor code, run under emulation.

The worker instruments the adapter's emulated vendor module (`instrument_vendor`, before
the first Accelerator starts the process group), so every call the adapter makes into it
is recorded, tagged with the adapter hook (`set_device`, `before_process_group`) it was made
from. The `vendor` check then reports what a real device needs from the adapter: that the
stand-in's current-device setter (`emulated.current_device_setters`) was called with the local
rank before the process group started, that the
device generators (`generator(index)` of the stand-in) are seeded by `set_seed`, consumed by
training and restored exactly by `load_state`, which hooks reached the vendor module, and
which grad scaler fp16 used. The suite judges it (`AdapterConformanceSuite.test_vendor_*`).
"""

from __future__ import annotations

import functools
import importlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..accelerator import Accelerator
from ..adapter.registry import get_adapter_class
from ..utils import set_seed
from .checks import _rank_world, check
from .emulated import CallRecord, current_device_setters, record_calls

_RECORD: CallRecord | None = None
_SETTERS: tuple[str, ...] = ()
DEVICE_HOOKS = ("set_device", "before_process_group")
"""The adapter hooks that run before the process group, whose vendor calls are tagged with their name."""


def instrument_vendor() -> None:
    """Record calls into the launched adapter's emulated vendor module (no-op when not emulated)."""
    global _RECORD, _SETTERS
    name = os.environ.get("ACCEL_ADAPTER")
    if os.environ.get("ACCEL_EMULATE") != "1" or not name:
        return
    try:
        cls = get_adapter_class(name)
    except Exception:
        return
    if cls.emulated_vendor_module:
        module = importlib.import_module(cls.emulated_vendor_module)
        _RECORD = record_calls(module)
        _SETTERS = current_device_setters(module)
        for hook in DEVICE_HOOKS:
            _tag(cls, hook, _RECORD)


def _tag(cls: type, hook: str, record: CallRecord) -> None:
    """Wrap the adapter's `hook` (in place, in this worker) so the vendor calls it makes carry its name."""
    original = getattr(cls, hook)

    @functools.wraps(original)
    def tagged(self: Any, *args: Any, **kwargs: Any) -> Any:
        with record.within(hook):
            return original(self, *args, **kwargs)

    setattr(cls, hook, tagged)


class _DeviceDropout(torch.nn.Module):
    """Dropout whose mask is drawn from the emulated device's generator, as device code draws."""

    def __init__(self, generator: Callable[[], torch.Generator]) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.rand(x.shape, generator=self.generator()) >= 0.5
        return x * mask.to(x.dtype) * 2.0


def _generator(vendor: Any, local_rank: int) -> Callable[[], torch.Generator] | None:
    """This rank's device generator, fetched anew for each draw (a stand-in may hand out a fresh one)."""
    make = getattr(vendor, "generator", None)
    if make is None:
        return None
    count = getattr(vendor, "device_count", None)
    index = local_rank if count is None or local_rank < int(count()) else 0
    return lambda: make(index)  # type: ignore[no-any-return]


def _state(vendor: Any, gen: Callable[[], torch.Generator]) -> bytes:
    """The device RNG state, comparable: the stand-in's `get_rng_state()`, else the generator's."""
    get = getattr(vendor, "get_rng_state", None)
    state = get() if get is not None else gen().get_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def _device_rng(out: Path, acc: Accelerator, gen: Callable[[], torch.Generator] | None) -> dict[str, Any]:
    """Seed, train with device dropout, save, train, load, train again: what the generator did. Without
    a `generator(index)` in the stand-in (optional: a warning) only the calls the hooks made are reported."""
    from .problems import HIDDEN, IN, LR, OUT, PER_RANK, make_data

    rank, world = _rank_world()
    record = _RECORD
    first = len(record.calls) if record else 0
    set_seed(1234)
    seeded_calls = record.since(first) if record else []
    draws = (lambda: torch.rand(8, generator=gen()).tolist()) if gen is not None else (lambda: None)
    seeded = draws()
    set_seed(1234)
    reseeded = draws()
    set_seed(4321)
    other_seed = draws()

    torch.manual_seed(0)
    dropout = _DeviceDropout(gen) if gen is not None else torch.nn.Dropout(0.5)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), dropout, torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    x, y = make_data(6 * PER_RANK * world)

    def train(steps: range) -> list[float]:
        losses = []
        for step in steps:
            s = slice((step * world + rank) * PER_RANK, (step * world + rank + 1) * PER_RANK)
            loss = torch.nn.functional.mse_loss(model(x[s].to(acc.device)), y[s].to(acc.device))
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    vendor = acc.adapter.vendor
    before = _state(vendor, gen) if gen is not None else b""
    train(range(2))
    consumed = before != _state(vendor, gen) if gen is not None else None
    mark = len(record.calls) if record else 0
    acc.save_state(out / "vendor-rng")
    saved_calls = record.since(mark) if record else []
    uninterrupted = train(range(2, 4))
    set_seed(999)  # whatever the generator holds now, load_state must restore the saved one
    mark = len(record.calls) if record else 0
    acc.load_state(out / "vendor-rng")
    loaded_calls = record.since(mark) if record else []
    resumed = train(range(2, 4))
    return {
        "seeded_equal": seeded == reseeded if gen is not None else None,
        "seed_changes_draws": seeded != other_seed if gen is not None else None,
        "consumed_by_training": consumed,
        "resumed_equal": uninterrupted == resumed if gen is not None else None,
        "losses_uninterrupted": uninterrupted,
        "losses_resumed": resumed,
        "set_seed_calls": seeded_calls,
        "save_state_calls": saved_calls,
        "load_state_calls": loaded_calls,
    }


@check("vendor")
def vendor(out: Path, __: str) -> dict[str, Any]:
    acc = Accelerator()
    adapter = acc.adapter
    cls = type(adapter)
    result: dict[str, Any] = {
        "emulated_vendor_module": cls.emulated_vendor_module,
        "vendor_module": cls.vendor_module,
        "hardware_device_type": cls.hardware_device_type,
        "local_rank": acc.local_process_index,
        "instrumented": _RECORD is not None,
    }
    if _RECORD is None:
        return result
    result["before_process_group"] = [
        {"name": c.name, "args": [_describe(a) for a in c.args], "hook": c.hook}
        for c in _RECORD.calls
        if not c.process_group_started
    ]
    result["device_setters"] = list(_SETTERS)
    gen = _generator(adapter.vendor, acc.local_process_index)
    result["has_generator"] = gen is not None
    result["rng"] = _device_rng(out, acc, gen)
    if "fp16" in cls.capabilities.precisions:
        from ..distributed.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        fp16 = Accelerator(mixed_precision="fp16")
        own = fp16.adapter.make_grad_scaler("fp16")
        vendor_scaler = getattr(fp16.adapter.vendor, "GradScaler", None)
        result["scaler"] = {
            "used": type(fp16.scaler).__qualname__ if fp16.scaler is not None else None,
            "adapter": type(own).__qualname__ if own is not None else None,
            "vendor": vendor_scaler.__qualname__ if isinstance(vendor_scaler, type) else None,
            "used_is_vendor": isinstance(vendor_scaler, type) and isinstance(fp16.scaler, vendor_scaler),
        }
    result["all_calls"] = sorted(set(_RECORD.names()))
    return result


def _describe(value: Any) -> Any:
    if isinstance(value, torch.device):
        return {"device": value.type, "index": value.index}
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return type(value).__name__
