"""The prepare walk's joints: pairing by parameter identity, re-pointing replaced parameters
once in the core, and `Strategy.setup(group, prepared, ctx)` as the one place an engine takes
a model with its optimizers and schedulers."""

from __future__ import annotations

import copy

import pytest
import torch
from accel import Accelerator, PrepareError
from accel.adapter.cpu import CPUAdapter
from accel.prepare.group import ParameterMap, PrepareGroup, group_objects
from accel.strategies.base import Strategy


def _kinds():
    return {
        "is_model": lambda o: isinstance(o, torch.nn.Module),
        "is_optimizer": lambda o: isinstance(o, torch.optim.Optimizer),
        "is_scheduler": lambda o: isinstance(o, torch.optim.lr_scheduler.LRScheduler),
    }


def test_objects_are_grouped_by_parameter_identity_whatever_their_order() -> None:
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt_b, opt_a = torch.optim.SGD(b.parameters(), lr=0.1), torch.optim.SGD(a.parameters(), lr=0.1)
    sched_a = torch.optim.lr_scheduler.StepLR(opt_a, 1)
    lonely = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    objects = [sched_a, opt_b, a, lonely, b, opt_a, "a loader"]
    groups = group_objects(objects, **_kinds())
    by_model = {g.model: g for g in groups}
    assert by_model[2].optimizers == [5] and by_model[2].schedulers == [0]
    assert by_model[4].optimizers == [1] and by_model[4].schedulers == []
    assert by_model[None].optimizers == [3]
    assert sum(len(g.optimizers) for g in groups) == 3


class Rebuilt(torch.nn.Module):
    """A model whose preparation replaces every parameter object (as placement on some devices does)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def _replace_parameters(self, model, ctx):  # the adapter hook, as a device that cannot share storage does it
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(param.detach().clone()))
    return model


def _step(model, opt, accelerator, x):
    accelerator.backward(model(x).pow(2).sum())
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("together", [True, False])
def test_optimizers_train_the_parameters_preparation_created(monkeypatch: pytest.MonkeyPatch, together: bool) -> None:
    torch.manual_seed(0)
    reference = Rebuilt()
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    monkeypatch.setattr(CPUAdapter, "place_model", _replace_parameters)
    accelerator = Accelerator()
    if together:
        model, opt = accelerator.prepare(model, opt)
    else:  # the optimizer in a later call: the core kept the old -> new map
        model = accelerator.prepare(model)
        opt = accelerator.prepare(opt)
    assert {id(p) for p in model.parameters()} == {id(p) for g in opt.param_groups for p in g["params"]}
    x = torch.randn(4, 3)
    for _ in range(3):
        _step(model, opt, accelerator, x)
        ref_opt.zero_grad()
        reference(x).pow(2).sum().backward()
        ref_opt.step()
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def _stepped_then_replaced(
    new: torch.nn.Parameter,
) -> tuple[torch.nn.Parameter, torch.optim.SGD, torch.nn.Module, ParameterMap]:
    """An SGD with momentum state for a module's parameter, then the parameter replaced by `new` and the
    replacement recorded: (the old parameter, the optimizer, the module, the map)."""
    old = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([old], lr=0.1, momentum=0.9)
    old.grad = torch.ones(4)
    opt.step()
    holder = torch.nn.Module()
    holder.w = old
    before = ParameterMap.snapshot(holder)
    holder.w = new
    mapping = ParameterMap()
    assert mapping.record(before, holder) == 1
    return old, opt, holder, mapping


def test_optimizer_state_moves_with_a_parameter_of_the_same_shape() -> None:
    _, opt, holder, mapping = _stepped_then_replaced(torch.nn.Parameter(torch.ones(4) - 0.1))
    assert mapping.repoint(opt) == 1
    assert opt.param_groups[0]["params"][0] is holder.w
    torch.testing.assert_close(opt.state[holder.w]["momentum_buffer"], torch.ones(4))


def test_optimizer_state_for_a_reshaped_parameter_is_refused_with_what_to_do() -> None:
    old, opt, _, mapping = _stepped_then_replaced(torch.nn.Parameter(torch.ones(2)))  # a shard
    with pytest.raises(PrepareError, match="Create the optimizer fresh before `prepare`") as info:
        mapping.repoint(opt)
    assert isinstance(info.value, ValueError)
    assert opt.param_groups[0]["params"][0] is old  # nothing half-changed


class Engine(torch.nn.Module):
    """What an engine-style strategy hands back: a wrapper that owns the model."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


class EngineStrategy(Strategy):
    """Takes each group whole, as DeepSpeed's `initialize` does, and replaces all three."""

    name = "engine-test"

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.groups: list[PrepareGroup] = []

    def setup(self, group, prepared, ctx):
        self.groups.append(group)
        if group.model is None:
            return group
        optimizers = [
            torch.optim.SGD(o.param_groups[0]["params"], lr=o.param_groups[0]["lr"]) for o in group.optimizers
        ]
        return group.replace(model=Engine(group.model), optimizers=optimizers)

    def unwrap(self, model):
        return model.module if isinstance(model, Engine) else model


def test_setup_receives_each_model_with_its_optimizers_and_schedulers_and_its_replacements_land() -> None:
    strategy = EngineStrategy()
    accelerator = Accelerator()
    accelerator.strategy = strategy  # a strategy object under test, without registering an entry point
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.5)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.25)
    sched_a = torch.optim.lr_scheduler.LambdaLR(opt_a, lambda step: 0.5**step)
    _, p_sched_a, p_a, p_b, p_opt_a = accelerator.prepare(opt_b, sched_a, a, b, opt_a)
    seen = {id(g.model): g for g in strategy.groups}
    assert set(seen) == {id(a), id(b)}
    assert seen[id(a)].optimizers == [opt_a] and seen[id(a)].schedulers == [sched_a]
    assert seen[id(b)].optimizers == [opt_b] and seen[id(b)].schedulers == []
    # The engine replaced the models in what prepare returned and in the registry.
    assert isinstance(p_a, Engine) and p_a.module is a and isinstance(p_b, Engine)
    assert accelerator._models == [p_a, p_b]
    # The replaced optimizers sit in the prepared wrappers, and the scheduler drives the new one.
    assert p_opt_a.optimizer is not opt_a and p_sched_a.scheduler.optimizer is p_opt_a.optimizer
    accelerator.backward(p_a(torch.ones(1, 2)).sum())
    p_opt_a.step()
    p_sched_a.step()
    assert p_opt_a.optimizer.param_groups[0]["lr"] == pytest.approx(0.25)


def test_a_setup_that_drops_an_optimizer_is_refused() -> None:
    class Dropping(Strategy):
        def setup(self, group, prepared, ctx):
            return group.replace(optimizers=[])

    accelerator = Accelerator()
    accelerator.strategy = Dropping()
    model = torch.nn.Linear(1, 1)
    with pytest.raises(TypeError, match="as many optimizers and schedulers"):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_an_adapter_sees_each_models_optimizers_of_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunContext.optimizers`: the core's pairing, for vendors that optimize a model with its optimizer."""
    seen: dict[int, tuple] = {}
    original = CPUAdapter.optimize_model

    def record(self, model, ctx):
        seen[id(model)] = ctx.optimizers
        return original(self, model, ctx)

    monkeypatch.setattr(CPUAdapter, "optimize_model", record)
    accelerator = Accelerator()
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    accelerator.prepare(opt_b, a, b, opt_a)
    assert seen == {id(a): (opt_a,), id(b): (opt_b,)}
    alone = torch.nn.Linear(2, 2)
    accelerator.prepare(alone)
    assert seen[id(alone)] == ()


def test_an_optimizer_prepared_before_its_model_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CPUAdapter, "place_model", _replace_parameters)
    accelerator = Accelerator()
    model = Rebuilt()
    opt = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    model = accelerator.prepare(model)
    assert {id(p) for p in model.parameters()} == {id(p) for g in opt.param_groups for p in g["params"]}
