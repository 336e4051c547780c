"""The `claims` check: what an adapter declares, against what it asks for, observable under emulation.

`claims_report(accelerator)` runs in one process (every rank of the kit's launch runs it; the kit's own
tests call it directly on planted-bug adapters) and reports, for the suite to judge
(`AdapterConformanceSuite.test_claim_*`):

- the `DistributedType` name a data-parallel run reports, and the adapter's `data_parallel_name`;
- the calls `free_memory` (the adapter's `empty_cache`) made into the adapter's vendor module;
- a model prepared with AdamW (weight decay) and a scheduler: the devices the walk asked the model onto
  (`Module.to`), whether the scheduler and the optimizer wrapper step the same optimizer once every hook
  (`after_prepare` included) has run, the learning rates each reports, and the trained weights against
  plain `torch.optim.AdamW` with the same schedule (an optimizer the adapter substitutes must match it);
- the device type each `autocast` the adapter builds asks for, emulated and on the hardware twin (the
  same class with `emulate=False`, asked without building anything), and the twin's device type and
  backend against `hardware_device_type` and `hardware_backend`;
- the stand-in module's public functions against the real vendor module's (imported when it can be),
  else against the names the stand-in declares the real one has (`REAL_FUNCTIONS`).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from ..accelerator import Accelerator
from ..adapter.base import Adapter
from .checks import check
from .emulated import record_calls
from .problems import build_model, flat_params, make_data

ADAMW = {"lr": 0.01, "weight_decay": 0.1, "betas": (0.9, 0.99), "eps": 1e-8}
"""The reference run's optimizer settings (weight decay large enough that coupling it shows)."""
STEPS = 12
KIT_ONLY_FUNCTIONS = frozenset({"generator"})
"""Stand-in functions the kit itself draws from, which a real vendor module need not have."""


def _schedule(step: int) -> float:
    return 1.0 / (1.0 + 0.1 * step)


class _Asked(Exception):
    """Raised by the recording `autocast` of the hardware twin: the device type was asked for, nothing built."""


@contextlib.contextmanager
def recording_autocast(asked: list[str], *, build: bool) -> Iterator[None]:
    """Record the device type of every `torch.autocast` built in the block (`build=False`: record, then raise
    `_Asked` instead of building one, for device types this torch does not know)."""
    cls = torch.amp.autocast_mode.autocast
    original = cls.__init__

    def init(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        asked.append(str(device_type))
        if not build:
            raise _Asked(device_type)
        original(self, device_type, *args, **kwargs)

    cls.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls.__init__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def recording_moves(moves: list[str]) -> Iterator[None]:
    """Record the device of every `Module.to(device)` called in the block."""
    original = torch.nn.Module.to

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None:
            moves.append(torch.device(device).type)
        return original(self, *args, **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def _vendor_path(adapter: Adapter) -> str | None:
    return type(adapter).emulated_vendor_module if adapter.emulate else type(adapter).vendor_module


def _distributed_type(adapter: Adapter) -> dict[str, Any]:
    cls = type(adapter)
    return {
        "declared": cls.data_parallel_name,
        "reported": adapter.data_parallel_type(True).name,
        "hardware_device_type": cls.hardware_device_type,
    }


def _empty_cache(acc: Accelerator) -> dict[str, Any]:
    adapter = acc.adapter
    path = _vendor_path(adapter)
    overridden = type(adapter).empty_cache is not Adapter.empty_cache
    if path is None:
        return {"module": None, "overridden": overridden}
    record = record_calls(adapter.vendor)
    start = len(record.calls)
    acc.free_memory()
    return {
        "module": path,
        "overridden": overridden,
        "vendor_has_empty_cache": callable(getattr(adapter.vendor, "empty_cache", None)),
        "calls": record.since(start),
    }


def _reference(steps: int, world: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Plain AdamW with the same schedule (stepped once per process, as the prepared scheduler steps)."""
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)  # type: ignore[arg-type]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule)
    for _ in range(steps):
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        for _ in range(world):
            sched.step()
        opt.zero_grad()
    return flat_params(model)


def _optimizer_run(acc: Accelerator) -> dict[str, Any]:
    """Prepare (model, AdamW, scheduler), train on the same batch on every rank, compare with `_reference`."""
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)  # type: ignore[arg-type]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule)
    moves: list[str] = []
    with recording_moves(moves):
        model, p_opt, p_sched = acc.prepare(model, opt, sched)
    params = list(acc.unwrap_model(model).parameters())
    x, y = make_data(8)
    lrs = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x.to(acc.device)), y.to(acc.device))
        acc.backward(loss)
        p_opt.step()
        p_sched.step()
        p_opt.zero_grad()
        lrs.append((float(p_sched.get_last_lr()[0]), float(p_opt.optimizer.param_groups[0]["lr"])))
    trained = torch.cat([p.detach().float().cpu().reshape(-1) for p in params])
    reference = _reference(STEPS, acc.num_processes, x, y)
    scheduled = getattr(p_sched.scheduler, "optimizer", None)
    return {
        "placement": {
            "moves": moves,
            "device_type": acc.device.type,
            "param_device_types": sorted({p.device.type for p in params}),
        },
        "optimizer": {
            "stepping": type(p_opt.optimizer).__qualname__,
            "scheduled": type(scheduled).__qualname__,
            "same_optimizer": scheduled is p_opt.optimizer,
            "lrs": lrs,
            "max_abs_diff": float((trained - reference).abs().max()),
            "finite": bool(math.isfinite(float(trained.sum()))),
        },
    }


def _autocast(adapter: Adapter) -> dict[str, Any]:
    """The device types the adapter's `autocast` asks for, emulated (built and entered) and on the twin."""
    cls = type(adapter)
    modes = [p for p in ("bf16", "fp16") if p in cls.capabilities.precisions]
    emulated: list[str] = []
    with recording_autocast(emulated, build=True):
        for mode in modes:
            with adapter.autocast(mode):
                pass
    twin_asked: list[str] = []
    twin: dict[str, Any] = {}
    try:
        hardware = cls(emulate=False, options=adapter.options)
        if cls.emulated_vendor_module is not None:
            hardware._vendor = adapter.vendor  # the stand-in: asking must not import the vendor stack
        twin = {"device_type": hardware.device_type, "backend": hardware.backend}
        with recording_autocast(twin_asked, build=False):
            for mode in modes:
                with contextlib.suppress(_Asked):
                    hardware.autocast(mode).__enter__()
    except Exception as exc:  # the twin cannot be asked here: judged in hardware mode only
        twin["error"] = f"{type(exc).__name__}: {exc}"
    return {
        "modes": modes,
        "emulated": emulated,
        "device_type": adapter.device_type,
        "twin": {**twin, "autocast": twin_asked},
        "hardware_device_type": cls.hardware_device_type,
        "hardware_backend": cls.hardware_backend,
    }


def _functions(module: ModuleType, *, own_only: bool) -> set[str]:
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if own_only:
            function = inspect.unwrap(value) if callable(value) else value
            if (inspect.isfunction(function) and function.__module__ == module.__name__) or inspect.ismethod(value):
                names.add(name)
        elif callable(value) and not inspect.isclass(value) and not inspect.ismodule(value):
            names.add(name)
    return names


def stand_in_names(cls: type[Adapter]) -> dict[str, Any]:
    """The stand-in's public functions, and the real vendor module's (or the list the stand-in declares)."""
    if cls.emulated_vendor_module is None or cls.vendor_module in (None, cls.emulated_vendor_module):
        return {"stand_in": None}
    stand_in = importlib.import_module(cls.emulated_vendor_module)
    own = _functions(stand_in, own_only=True) - KIT_ONLY_FUNCTIONS - set(getattr(stand_in, "EMULATION_ONLY", ()))
    report: dict[str, Any] = {
        "stand_in": sorted(own),
        "module": cls.emulated_vendor_module,
        "real_module": cls.vendor_module,
    }
    try:
        real = importlib.import_module(cls.vendor_module)
    except Exception as exc:
        report["import_error"] = f"{type(exc).__name__}: {exc}"
        declared = getattr(stand_in, "REAL_FUNCTIONS", None)
        report["real"] = sorted(declared) if declared is not None else None
        report["source"] = f"{cls.emulated_vendor_module}.REAL_FUNCTIONS" if declared is not None else None
        return report
    report["real"] = sorted(_functions(real, own_only=False))
    report["source"] = cls.vendor_module
    return report


def claims_report(acc: Accelerator) -> dict[str, Any]:
    """Every claim of `acc.adapter` that one process can observe (see the module docstring)."""
    report: dict[str, Any] = {"emulate": acc.adapter.emulate, "distributed_type": _distributed_type(acc.adapter)}
    report.update(_optimizer_run(acc))
    report["autocast"] = _autocast(acc.adapter)
    report["names"] = stand_in_names(type(acc.adapter))
    report["empty_cache"] = _empty_cache(acc)  # last: free_memory drops what the Accelerator prepared
    return report


@check("claims")
def claims(_: Path, __: str) -> dict[str, Any]:
    return claims_report(Accelerator())


@check("hardware")
def hardware(_: Path, __: str) -> dict[str, Any]:
    """Hardware mode (no emulation): where the parameters are, the backend in use, the dtype a matmul on the
    device computes in under each claimed autocast, and the vendor's device RNG round trip."""
    import torch.distributed as dist

    acc = Accelerator()
    adapter = acc.adapter
    model = acc.prepare(build_model())
    autocast = {}
    for mode in ("bf16", "fp16"):
        if mode in type(adapter).capabilities.precisions:
            a = torch.ones(4, 4, device=acc.device)
            with adapter.autocast(mode):
                autocast[mode] = str((a @ a).dtype)
    rng = None
    state = adapter.get_device_rng_state()
    if state is not None:
        first = torch.rand(8, device=acc.device).tolist()
        adapter.set_device_rng_state(state)
        again = torch.rand(8, device=acc.device).tolist()
        adapter.manual_seed(1)
        one = torch.rand(8, device=acc.device).tolist()
        adapter.manual_seed(2)
        rng = {"restored_equal": first == again, "seed_changes_draws": one != torch.rand(8, device=acc.device).tolist()}
    return {
        "param_device_types": sorted({p.device.type for p in model.parameters()}),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "autocast": autocast,
        "rng": rng,
    }
