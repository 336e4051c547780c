"""Conformance checks about models and state: resume, saving, unwrapping, compile, errors and emulation.

Registered in `accel.testing.checks.CHECKS` like the training checks; see that module.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, TensorDataset

from ..accelerator import Accelerator
from ..prepare.walk import model_walk
from ..settings.kwargs import TorchDynamoPlugin
from .checks import TRAIN_STEPS, _rank_world, _sgd_setup, _train_slices, check
from .problems import LR, PER_RANK, build_model, flat_params, make_data


@check("resume")
def resume(out: Path, strategy: str) -> dict[str, Any]:
    """Save mid-epoch, keep training; then load into fresh objects and train to the same end."""
    directory = out / f"resume-{strategy}"
    saved_at, epochs = 3, 2

    def setup(init_seed: int) -> tuple[Accelerator, Any, Any, Any, Any]:
        from ..distributed.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        acc = Accelerator(strategy=strategy)
        model = build_model(dropout=0.1, seed=init_seed)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        x, y = make_data(2 * PER_RANK * acc.num_processes * 4)
        loader = DataLoader(TensorDataset(x, y), batch_size=PER_RANK, shuffle=True)
        return (acc, *acc.prepare(model, opt, loader, sched))

    def train(acc: Accelerator, model: Any, opt: Any, loader: Any, sched: Any) -> list[float]:
        losses = []
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(float(loss.detach()))
        return losses

    rank, _ = _rank_world()
    torch.manual_seed(100 + rank)  # dropout differs per rank, as in real training
    acc, model, opt, loader, sched = setup(init_seed=0)
    first: list[float] = []
    for step, (xb, yb) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        first.append(float(loss.detach()))
        if step + 1 == saved_at:
            acc.save_state(directory)
    for _epoch in range(1, epochs):
        first += train(acc, model, opt, loader, sched)
    uninterrupted = flat_params(acc.unwrap_model(model))

    torch.manual_seed(999)  # whatever the RNG holds now, load_state must restore the saved one
    acc, model, opt, loader, sched = setup(init_seed=7)
    acc.load_state(directory)
    second = train(acc, model, opt, acc.skip_first_batches(loader, saved_at), sched)
    for _epoch in range(1, epochs):
        second += train(acc, model, opt, loader, sched)
    resumed = flat_params(acc.unwrap_model(model))
    return {
        "bitwise_equal": bool(torch.equal(uninterrupted, resumed)),
        "max_abs_diff": float((uninterrupted - resumed).abs().max()),
        "losses_uninterrupted": first[saved_at:],
        "losses_resumed": second,
    }


@check("save_model")
def save_model(out: Path, strategy: str) -> dict[str, Any]:
    acc = Accelerator(strategy=strategy)
    model, opt = _sgd_setup(acc)
    _train_slices(acc, model, opt, 2)
    directory = out / f"saved-model-{strategy}"
    acc.save_model(model, directory)
    acc.save_model(model, out / f"saved-model-{strategy}-sharded", max_shard_size="200B")
    return {"directory": str(directory), "params": flat_params(acc.unwrap_model(model)).tolist()}


@check("unwrap_model")
def unwrap_model(_: Path, mode: str) -> dict[str, Any]:
    acc = Accelerator(mixed_precision=mode)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    prepared, _opt = acc.prepare(model, opt)
    unwrapped = acc.unwrap_model(prepared)
    plain = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    return {
        "is_original": unwrapped is model,
        "forward_restored": getattr(plain.forward, "__func__", None) is type(model).forward,
        "prepared_type": type(prepared).__name__,
    }


@check("compile")
def compile_(_: Path, __: str) -> dict[str, Any]:
    from ..prepare.wrappers import is_compiled_module

    acc = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="default"))
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    prepared, opt = acc.prepare(model, opt)
    compiled = any(is_compiled_module(m) for m in (prepared, getattr(prepared, "module", prepared)))
    losses = _train_slices(acc, prepared, opt, TRAIN_STEPS)
    return {
        "compiled": compiled,
        "unwrapped_is_original": acc.unwrap_model(prepared, keep_torch_compile=False) is model,
        "params": flat_params(model).tolist(),
        "losses": losses,
    }


@check("errors")
def errors(out: Path, __: str) -> dict[str, Any]:
    from ..distributed.state import AcceleratorState, GradientState
    from .catalogue import CASES, run_case

    reports = {}
    for case in CASES:
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        reports[case.name] = run_case(case, out)
    return reports


def module_tree(model: torch.nn.Module) -> list[str]:
    """Each submodule as `qualified.name: TypeName`, plus what wraps the forward: the shape of a prepared model."""
    tree = [f"{name or '<root>'}: {type(m).__name__}" for name, m in model.named_modules()]
    for name, m in model.named_modules():
        if "_original_forward" in m.__dict__:
            tree.append(f"{name or '<root>'}: forward wrapped")
    return tree


def hardware_twin(adapter: Any) -> Any:
    """The same adapter class with `emulate=False`, pinned to the CPU, gloo and the stand-in vendor module.

    Preparing a model through it shows what the adapter decides on hardware: a decision that
    branches on `emulate` shows up as a different module tree.
    """
    cls = type(adapter)
    twin_cls = type(f"{cls.__name__}HardwareTwin", (cls,), {"device_type": "cpu", "backend": "gloo"})
    twin = twin_cls(emulate=False, options=adapter.options)
    if cls.emulated_vendor_module is not None:
        twin._vendor = adapter.vendor
    return twin


def decision_record(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """What an adapter decided about a prepared model (and optimizer), beyond its module tree.

    Each parameter's dtype and memory format, the optimizer's class and its `fused`/`foreach`
    flags, plus whatever the adapter adds through an optional `decision_record(model, optimizer)`
    method (a dict of JSON values: a vendor layer's mode, a fused kernel's switch). The kit
    compares it between the emulated adapter and its `hardware_twin`.
    """
    params = {}
    for name, p in model.named_parameters():
        if p.is_contiguous():
            layout = "contiguous"
        elif p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last):
            layout = "channels_last"
        else:
            layout = "strided"
        params[name] = f"{str(p.dtype).removeprefix('torch.')} {layout}"
    record: dict[str, Any] = {"parameters": params}
    if optimizer is not None:
        inner = getattr(optimizer, "optimizer", optimizer)
        record["optimizer"] = type(inner).__qualname__
        # A flag set per parameter group (`group["fused"] = True`) counts as much as the constructor's.
        record["optimizer_flags"] = {
            k: inner.defaults.get(k) for k in ("fused", "foreach", "capturable") if k in inner.defaults
        }
        for i, group in enumerate(inner.param_groups):
            for k in ("fused", "foreach", "capturable"):
                if k in group and group[k] != inner.defaults.get(k):
                    record["optimizer_flags"][f"group{i}.{k}"] = group[k]
    return record


class AdapterDecisionRecord(Protocol):
    """An optional adapter hook the conformance kit reads (no base implementation in `Adapter`)."""

    def decision_record(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        """The adapter's own decisions about a prepared model and optimizer, as JSON values (a vendor
        layer's mode, a fused kernel's switch, how many layers were swapped). Called by the kit's
        emulation-decision check after the walk's model steps and `prepare_optimizer`, once through the emulated
        adapter and once through its `hardware_twin`; the two results must be equal. Default: not
        defined, and the record holds only the kit's own entries (parameter dtypes and memory formats,
        optimizer class and flags)."""
        ...


def load_factory(path: str) -> Any:
    """`package.module:function` imported and looked up (the kit's extension points name code this way)."""
    import importlib

    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"{path!r} must be 'package.module:function'")
    return getattr(importlib.import_module(module), attr)


def _decisions(adapter: Any, ctx: Any, factory: Any) -> dict[str, Any]:
    built = factory()
    model, optimizer = built if isinstance(built, tuple) else (built, None)
    prepared = model_walk(model, dataclasses.replace(ctx, adapter=adapter))
    if optimizer is not None:
        optimizer = adapter.prepare_optimizer(optimizer, ctx)
    record = decision_record(prepared, optimizer)
    own = getattr(adapter, "decision_record", None)
    if callable(own):
        record["adapter"] = own(prepared, optimizer)
    return {"tree": module_tree(prepared), "record": record}


def _mlp_with_adamw() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The kit's model with an optimizer: a fused-kernel switch that only hardware takes shows in the record."""
    model = build_model()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)


@check("emulation")
def emulation(_: Path, models: str) -> dict[str, Any]:
    """Prepare the kit's model and each of the adapter's own (`emulation_models`) twice: through the
    emulated adapter and through its hardware twin; report both module trees and decision records."""
    acc = Accelerator()
    ctx = acc._run(device_placement=True)
    factories = [("kit MLP", _mlp_with_adamw)] + [(path, load_factory(path)) for path in models.split(",") if path]
    twin = hardware_twin(acc.adapter)
    results = []
    for name, factory in factories:
        torch.manual_seed(0)
        emulated = _decisions(acc.adapter, ctx, factory)
        torch.manual_seed(0)
        hardware = _decisions(twin, ctx, factory)
        results.append({"model": name, "emulated": emulated, "hardware": hardware})
    return {"emulate": acc.adapter.emulate, "models": results}


@check("custom")
def custom(out: Path, path: str) -> Any:
    """An adapter's own distributed check (`AdapterConformanceSuite.extra_checks`): `function(out)` run on every rank."""
    return load_factory(path)(out)
