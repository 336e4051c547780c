"""An adapter built for version 1 of the adapter contract still trains; any other version is refused by name.

The adapters here are installed the way a package installs them: a `*.dist-info` directory with
an `accel.adapter` entry point, put on `sys.path` for the test (see `installed_package`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel import Accelerator, AdapterNotFoundError
from accel.adapter import registry
from accel.adapter.base import ADAPTER_API_VERSION, SUPPORTED_ADAPTER_API_VERSIONS, Adapter, Capabilities
from accel.errors import StrategyNotFoundError
from accel.prepare.context import PrepareContext
from accel.strategies.ddp import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

DISTRIBUTION = "accel-versions-example"
STEPS = 3


class VersionOneAdapter(Adapter):
    """Written against version 1: it knows none of version 2's hooks (`data_parallel_name`,
    `default_strategy`, `options_class`, ...), still defines the two version 2 removed, re-points
    optimizers itself in `after_prepare` as version 1 asked, and returns a new optimizer from
    `prepare_optimizer` (a vendor's fused one)."""

    name: ClassVar[str] = "versionone"
    priority: ClassVar[int] = -100
    api_version: ClassVar[int] = 1
    capabilities: ClassVar[Capabilities] = Capabilities(precisions=frozenset({"no"}), strategies=frozenset({"ddp"}))

    def __init__(self, *, emulate: bool = False, options: Any = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self.calls: list[str] = []
        self.replaced: dict[int, tuple[torch.nn.Parameter, torch.nn.Parameter]] = {}
        """id(old) -> (old, new): the old parameter is kept so that its id is not reused."""

    # Removed in version 2 (nothing called them): defining them is harmless.
    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def memory_stats(self) -> dict[str, int]:
        self.calls.append("memory_stats")
        return {}

    def before_prepare(self, objects: list[Any], ctx: PrepareContext) -> None:
        self.calls.append(f"before_prepare({len(objects)})")

    def place_model(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        # A device whose tensors cannot share storage with the host: every parameter becomes a new object.
        model = model.to(ctx.device)
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    new = torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
                    module._parameters[name] = new
                    self.replaced[id(param)] = (param, new)
        self.calls.append("place_model")
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: PrepareContext) -> torch.optim.Optimizer:
        self.calls.append("prepare_optimizer")
        groups = [{k: v for k, v in group.items() if k != "initial_lr"} for group in optimizer.param_groups]
        return type(optimizer)(groups, **optimizer.defaults)

    def after_prepare(self, prepared: list[Any], ctx: PrepareContext) -> None:
        # The version-1 way: point the prepared optimizers at the parameters `place_model` made
        # (version 2's core has done it already; doing it again must change nothing).
        for obj in prepared:
            inner = getattr(obj, "optimizer", None)
            if isinstance(inner, torch.optim.Optimizer) and not hasattr(obj, "get_last_lr"):
                for group in inner.param_groups:
                    group["params"] = [self._current(p) for p in group["params"]]
        self.calls.append(f"after_prepare({len(prepared)})")

    def _current(self, param: torch.nn.Parameter) -> torch.nn.Parameter:
        old, new = self.replaced.get(id(param), (None, param))
        return new if old is param else param


class GradientHookAdapter(VersionOneAdapter):
    """A version-1 adapter that ran the backward pass and paused its own gradient reduction: the core
    no longer calls either hook (they belong to strategies), so it must not load silently."""

    name: ClassVar[str] = "gradienthooks"
    priority: ClassVar[int] = 1000

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def no_sync(self, model: torch.nn.Module) -> Any:
        return contextlib.nullcontext()


class VersionOneStrategy(DDPStrategy):
    """A strategy written before `setup`: it replaced the optimizer in `prepare_optimizer`."""

    name: ClassVar[str] = "oldddp"

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: Any) -> torch.optim.Optimizer:
        return optimizer


class VersionZeroAdapter(VersionOneAdapter):
    name: ClassVar[str] = "versionzero"
    priority: ClassVar[int] = 1000  # available: were it loaded, automatic selection would pick it
    api_version: ClassVar[int] = 0


class NextVersionAdapter(VersionOneAdapter):
    name: ClassVar[str] = "nextversion"
    priority: ClassVar[int] = 1000
    api_version: ClassVar[int] = ADAPTER_API_VERSION + 1


@pytest.fixture
def installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`accel-versions-example` installed: its three adapters are entry points of this module."""
    info = tmp_path / "accel_versions_example-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.1\n")
    adapters = (
        VersionOneAdapter,
        VersionZeroAdapter,
        NextVersionAdapter,
        GradientHookAdapter,
    )
    points = {cls.name: f"{__name__}:{cls.__name__}" for cls in adapters}
    (info / "entry_points.txt").write_text(
        "[accel.adapter]\n"
        + "".join(f"{name} = {value}\n" for name, value in points.items())
        + f"[accel.strategies]\n{VersionOneStrategy.name} = {__name__}:{VersionOneStrategy.__name__}\n"
    )
    for name in ("ACCEL_ADAPTER", "ACCEL_EMULATE", "ACCEL_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.clear_cache()
    yield
    monkeypatch.undo()
    registry.clear_cache()


def _data() -> tuple[torch.nn.Module, DataLoader, list[float]]:  # type: ignore[type-arg]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x, y = torch.randn(STEPS * 8, 4), torch.randn(STEPS * 8, 1)
    return model, DataLoader(TensorDataset(x, y), batch_size=8), []


def _optimizer_and_scheduler(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))


def _train(model: Any, optimizer: Any, scheduler: Any, loader: Any, backward: Any, lrs: list[float]) -> None:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])


def test_an_adapter_built_for_version_one_prepares_and_trains_like_plain_torch(installed_package: None) -> None:
    assert 1 in SUPPORTED_ADAPTER_API_VERSIONS and ADAPTER_API_VERSION > 1
    reference, loader, reference_lrs = _data()
    optimizer, scheduler = _optimizer_and_scheduler(reference)
    _train(reference, optimizer, scheduler, loader, lambda loss: loss.backward(), reference_lrs)

    model, loader, lrs = _data()
    optimizer, scheduler = _optimizer_and_scheduler(model)
    accelerator = Accelerator(adapter="versionone")
    adapter = accelerator.adapter
    assert type(adapter) is VersionOneAdapter
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    # The adapter's hooks ran, once each, and the ones version 2 removed were never called.
    assert adapter.calls == ["before_prepare(4)", "place_model", "prepare_optimizer", "after_prepare(4)"]
    # Its replacement optimizer is the one that trains, on the parameters its placement made,
    # and the scheduler built on the user's optimizer follows it.
    assert optimizer.optimizer is scheduler.scheduler.optimizer
    assert [id(p) for p in optimizer.optimizer.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    assert len(adapter.replaced) == 4 and not any(id(p) in adapter.replaced for p in model.parameters())
    _train(model, optimizer, scheduler, loader, accelerator.backward, lrs)

    assert adapter.calls[4:] == []
    assert lrs == reference_lrs == [0.05, 0.1 / 3, 0.025]
    trained = accelerator.unwrap_model(model).state_dict()
    for name, expected in reference.state_dict().items():
        assert torch.equal(trained[name], expected), name
    # Not a vacuous comparison: training moved the weights.
    torch.manual_seed(0)
    initial = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).state_dict()
    assert all(not torch.equal(trained[name], initial[name]) for name in initial)


@pytest.mark.parametrize(("adapter", "version"), [("versionzero", 0), ("nextversion", ADAPTER_API_VERSION + 1)])
def test_an_adapter_for_an_unsupported_version_is_refused_by_name(
    installed_package: None, adapter: str, version: int
) -> None:
    supported = sorted(SUPPORTED_ADAPTER_API_VERSIONS)
    reason = (
        f"built for adapter API {version}, this accel-base speaks {supported} (current {ADAPTER_API_VERSION}); "
        f"upgrade {DISTRIBUTION} or accel-base so they match"
    )
    assert registry.broken_adapters()[adapter] == reason
    with pytest.raises(AdapterNotFoundError) as refused:
        Accelerator(adapter=adapter)
    message = str(refused.value)
    assert message.startswith(f"The accel adapter {adapter!r} (from {DISTRIBUTION}, {__name__}:")
    assert message.endswith(f"failed to load: {reason}")
    # The supported adapter of the same package is unaffected, and automatic selection passes over the refused ones.
    assert registry.get_adapter_class("versionone") is VersionOneAdapter
    assert registry.select_adapter().name not in ("versionzero", "nextversion")


def test_an_adapter_that_defines_a_removed_gradient_hook_is_refused_by_name(
    installed_package: None,
) -> None:
    reason = registry.broken_adapters()["gradienthooks"]
    assert reason == (
        f"{__name__}.GradientHookAdapter defines backward, no_sync, which this accel-base no longer calls "
        "(docs/adapters.md, 'Versions of the contract'). Move it: `backward`: run the backward pass in a strategy "
        "of your package (`Strategy.backward`); `no_sync`: pause gradient synchronisation in a strategy of your "
        "package (`Strategy.no_sync`)"
    )
    with pytest.raises(
        AdapterNotFoundError,
        match=r"failed to load: .*GradientHookAdapter defines backward",
    ):
        Accelerator(adapter="gradienthooks")
    # Its priority would have won automatic selection; refused, it is passed over.
    assert registry.select_adapter().name != "gradienthooks"


def test_a_strategy_that_defines_a_removed_prepare_hook_is_refused_by_name(
    installed_package: None,
) -> None:
    with pytest.raises(StrategyNotFoundError) as refused:
        Accelerator(adapter="versionone", strategy="oldddp")
    assert str(refused.value) == (
        f"The accel strategy 'oldddp' ({DISTRIBUTION}) failed to load: {__name__}.VersionOneStrategy defines "
        "prepare_optimizer, which this accel-base no longer calls (docs/adapters.md, 'Versions of the contract'). "
        "Move it: `prepare_optimizer`: return the replaced optimizers from `setup(group, prepared, ctx)`"
    )
    # The parent it extends (which defines none of them) still loads.
    assert registry.get_strategy_class("ddp") is DDPStrategy
