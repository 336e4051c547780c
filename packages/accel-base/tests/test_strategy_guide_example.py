"""The setup-based strategy that docs/adapters.md ("The strategy contract") shows does what the guide says."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.adapter import registry
from accel.adapter.cpu import CPUAdapter
from accel.errors import StrategyNotSupportedError

GUIDE = Path(__file__).parents[3] / "docs" / "adapters.md"


def _example() -> types.ModuleType:
    text = GUIDE.read_text()
    section = text.split("### `setup`, and the version-1 prepare hooks")[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the guide's setup example is gone"
    module = types.ModuleType("accel_guide_strategy")
    exec(compile(code[1], str(GUIDE), "exec"), module.__dict__)
    return module


@pytest.fixture
def guide_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """The example installed as the guide says: an `accel.strategies` entry point named `engine`."""
    module = _example()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    info = tmp_path / "accel_guide_strategy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accel-guide-strategy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[accel.strategies]\nengine = {module.__name__}:EngineStrategy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("ACCEL_STRATEGY", raising=False)
    registry.clear_cache()
    yield module
    monkeypatch.undo()
    registry.clear_cache()


def _setup(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)


def test_the_guide_s_engine_strategy_takes_the_model_with_its_optimizer(
    guide_strategy: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = [torch.randn(4, 3) for _ in range(3)]
    reference, ref_opt, ref_sched = _setup()
    for x in batches:
        reference(x).square().mean().backward()
        ref_opt.step()
        ref_sched.step()
        ref_opt.zero_grad()

    # An adapter runs only the strategies it lists.
    with pytest.raises(StrategyNotSupportedError, match=r"does not support the 'engine' strategy"):
        Accelerator(adapter="cpu", strategy="engine")
    claims = dataclasses.replace(CPUAdapter.capabilities, strategies=CPUAdapter.capabilities.strategies | {"engine"})
    monkeypatch.setattr(CPUAdapter, "capabilities", claims)
    accelerator = Accelerator(adapter="cpu", strategy="engine")
    user_model, optimizer, scheduler = _setup()
    model, optimizer, scheduler = accelerator.prepare(user_model, optimizer, scheduler)
    # What the guide says after `prepare`.
    assert isinstance(model, guide_strategy.Engine)
    assert optimizer.optimizer is model.optimizer and scheduler.scheduler.optimizer is model.optimizer
    assert accelerator.unwrap_model(model) is user_model
    assert accelerator._models == [model]
    for x in batches:
        accelerator.backward(model(x).square().mean())
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    assert scheduler.get_last_lr() == ref_sched.get_last_lr() == [0.0125]
    for name, expected in reference.state_dict().items():
        assert torch.equal(user_model.state_dict()[name], expected), name
