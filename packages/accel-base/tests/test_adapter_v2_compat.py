"""An adapter built for version 2 of the adapter contract still trains (with a DeprecationWarning); a version-3
adapter that defines a version-2 prepare hook is refused by name.

Version 2 adapters drove the model's preparation themselves (`prepare_model` and its steps `apply_precision`,
`apply_strategy`, `compile_model`); version 3's core drives the walk (`accel.prepare.walk`). The adapters here
are installed the way a package installs them: a `*.dist-info` directory with an `accel.adapter` entry point.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel import Accelerator, AdapterNotFoundError
from accel.adapter import registry
from accel.adapter.base import ADAPTER_API_VERSION, DEPRECATED_ADAPTER_API_VERSIONS, Adapter, Capabilities
from accel.prepare.context import PrepareContext
from torch.utils.data import DataLoader, TensorDataset

DISTRIBUTION = "accel-v2-example"
STEPS = 3


class VersionTwoAdapter(Adapter):
    """Written against version 2, the way accel-gaudi's adapter was: its own `prepare_model` (a placement rule,
    then the steps through `super()`), an `apply_strategy` that checks the model before handing it to the
    strategy, and a fused-optimizer swap in `prepare_optimizer`."""

    name: ClassVar[str] = "versiontwo"
    priority: ClassVar[int] = -100
    api_version: ClassVar[int] = 2
    capabilities: ClassVar[Capabilities] = Capabilities(precisions=frozenset({"no"}), strategies=frozenset({"ddp"}))

    def __init__(self, *, emulate: bool = False, options: Any = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self.calls: list[str] = []

    def prepare_model(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        self.calls.append(f"prepare_model(placement={ctx.device_placement}, strategy={ctx.strategy.name})")
        if ctx.device_placement:
            model = self.place_model(model, ctx)
        model = self.apply_precision(model, ctx)
        if not ctx.evaluation_mode:
            model = self.apply_strategy(model, ctx)
        return self.compile_model(model, ctx)

    def apply_strategy(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        self.calls.append("apply_strategy")
        return super().apply_strategy(model, ctx)

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: PrepareContext) -> torch.optim.Optimizer:
        self.calls.append("prepare_optimizer")
        return type(optimizer)([{k: v for k, v in g.items() if k != "initial_lr"} for g in optimizer.param_groups])


class ThreeWithAPrepareModel(VersionTwoAdapter):
    """Declares version 3 but still defines version 2's `prepare_model`: the core would never call it."""

    name: ClassVar[str] = "threewithprepare"
    priority: ClassVar[int] = 1000  # available: were it loaded, automatic selection would pick it
    api_version: ClassVar[int] = 3


class UndeclaredTwo(Adapter):
    """A version-2 adapter that never set `api_version` (it inherited 2 from the base then) and defines
    `prepare_model`: taken for version 2, not refused."""

    name: ClassVar[str] = "undeclaredtwo"
    priority: ClassVar[int] = -200
    capabilities: ClassVar[Capabilities] = Capabilities(precisions=frozenset({"no"}), strategies=frozenset({"ddp"}))

    def prepare_model(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        return super().prepare_model(model, ctx)


@pytest.fixture
def installed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`accel-v2-example` installed: its adapters are entry points of this module."""
    info = tmp_path / "accel_v2_example-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 0.1\n")
    points = {
        cls.name: f"{__name__}:{cls.__name__}" for cls in (VersionTwoAdapter, ThreeWithAPrepareModel, UndeclaredTwo)
    }
    (info / "entry_points.txt").write_text(
        "[accel.adapter]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
    )
    for name in ("ACCEL_ADAPTER", "ACCEL_EMULATE", "ACCEL_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.clear_cache()
    registry._WARNED_VERSIONS.clear()
    yield
    monkeypatch.undo()
    registry.clear_cache()


def _data() -> tuple[torch.nn.Module, DataLoader, list[float]]:  # type: ignore[type-arg]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x, y = torch.randn(STEPS * 8, 4), torch.randn(STEPS * 8, 1)
    return model, DataLoader(TensorDataset(x, y), batch_size=8), []


def _train(model: Any, optimizer: Any, scheduler: Any, loader: Any, backward: Any, lrs: list[float]) -> None:
    for x, y in loader:
        backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])


def _optimizer_and_scheduler(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))


def test_an_adapter_built_for_version_two_prepares_and_trains_like_plain_torch(installed_package: None) -> None:
    assert 2 in DEPRECATED_ADAPTER_API_VERSIONS and ADAPTER_API_VERSION == 3
    reference, loader, reference_lrs = _data()
    optimizer, scheduler = _optimizer_and_scheduler(reference)
    _train(reference, optimizer, scheduler, loader, lambda loss: loss.backward(), reference_lrs)

    model, loader, lrs = _data()
    optimizer, scheduler = _optimizer_and_scheduler(model)
    with pytest.warns(DeprecationWarning) as caught:
        accelerator = Accelerator(adapter="versiontwo")
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any("was built for adapter API 2; this accel-base speaks 3" in m for m in messages), messages
    assert any("defines prepare_model, apply_strategy, which version 3" in m for m in messages), messages
    adapter = accelerator.adapter
    assert type(adapter) is VersionTwoAdapter
    # Its own walk ran once, through its strategy step, and the core did not wrap the model a second time.
    assert adapter.calls == ["prepare_model(placement=True, strategy=ddp)", "apply_strategy", "prepare_optimizer"]
    assert optimizer.optimizer is scheduler.scheduler.optimizer
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # said once per adapter class, not per step
        _train(model, optimizer, scheduler, loader, accelerator.backward, lrs)
    assert lrs == reference_lrs
    trained = accelerator.unwrap_model(model).state_dict()
    for name, expected in reference.state_dict().items():
        torch.testing.assert_close(trained[name], expected, rtol=0, atol=0, msg=name)
    torch.manual_seed(0)
    initial = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).state_dict()
    assert all(not torch.equal(trained[name], initial[name]) for name in initial)  # training moved the weights


def test_a_version_three_adapter_that_defines_a_version_two_prepare_hook_is_refused_by_name(
    installed_package: None,
) -> None:
    reason = registry.broken_adapters()["threewithprepare"]
    assert reason.startswith(
        f"{__name__}.ThreeWithAPrepareModel declares adapter API 3 but defines prepare_model, apply_strategy, which "
        "the version-3 core no longer calls: it drives the prepare walk itself (docs/adapters.md, 'Versions of the "
        "contract'). Instead: `prepare_model`: let the core's walk prepare the model;"
    ), reason
    with pytest.raises(AdapterNotFoundError, match=r"threewithprepare.*failed to load: .*declares adapter API 3"):
        Accelerator(adapter="threewithprepare")
    with pytest.warns(DeprecationWarning, match=r"'versiontwo' adapter"):  # the loaded one of the package
        assert registry.select_adapter().name == "versiontwo"


def test_an_adapter_that_never_declared_a_version_and_defines_prepare_model_is_taken_for_version_two(
    installed_package: None,
) -> None:
    assert "undeclaredtwo" not in registry.broken_adapters()
    assert registry.effective_api_version(UndeclaredTwo) == 2
    with pytest.warns(DeprecationWarning, match=r"'undeclaredtwo' adapter .* was built for adapter API 2"):
        accelerator = Accelerator(adapter="undeclaredtwo")
    with pytest.warns(DeprecationWarning, match=r"defines prepare_model, which version 3"):
        model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert isinstance(model, torch.nn.Linear)
