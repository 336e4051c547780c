"""Re-pointing optimizers at replaced parameters, checked without a device: torch's
`overwrite_module_params_on_conversion` makes `module.to(dtype)` replace Parameters the way
placement on an XLA device does, so the same trap and the same fix show on the CPU. The fix
is the core's (`accel.prepare.group.ParameterMap`, run by every `prepare`); the adapter keeps
only the re-tying of tied weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from accel.prepare.group import ParameterMap
from accel_xla.repoint import retie, tied_groups


@pytest.fixture
def replacing_conversion() -> Iterator[None]:
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    yield
    torch.__future__.set_overwrite_module_params_on_conversion(False)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g).to(dtype)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_the_trap_is_real(replacing_conversion: None) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to(torch.float64)
    before = [p.detach().clone() for p in model.parameters()]
    _train(model, opt, 2, torch.float64)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_repointed_optimizer_equals_one_built_after(replacing_conversion: None) -> None:
    early = _model()
    before = ParameterMap.snapshot(early)
    opt_early = torch.optim.SGD(early.parameters(), lr=0.1, momentum=0.9)
    early.to(torch.float64)
    mapping = ParameterMap()
    mapping.record(before, early)
    assert mapping.repoint(opt_early) == 4

    late = _model().to(torch.float64)
    opt_late = torch.optim.SGD(late.parameters(), lr=0.1, momentum=0.9)
    _train(early, opt_early, 3, torch.float64)
    _train(late, opt_late, 3, torch.float64)
    for a, b in zip(early.parameters(), late.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_existing_adam_state_is_rekeyed_and_converted(replacing_conversion: None) -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    _train(model, opt, 2, torch.float32)
    moments = [opt.state[p]["exp_avg"].clone() for p in model.parameters()]
    before = ParameterMap.snapshot(model)
    model.to(torch.float64)
    mapping = ParameterMap()
    mapping.record(before, model)
    mapping.repoint(opt)

    params = list(model.parameters())
    assert set(opt.state) == set(params)
    for p, m in zip(params, moments):
        assert opt.state[p]["exp_avg"].dtype == torch.float64
        torch.testing.assert_close(opt.state[p]["exp_avg"], m.double())
        assert opt.state[p]["step"].device.type == "cpu"

    reference = _model()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    _train(reference, ref_opt, 2, torch.float32)
    reference.to(torch.float64)
    ref_opt = _reloaded(ref_opt, reference)
    _train(model, opt, 2, torch.float64)
    _train(reference, ref_opt, 2, torch.float64)
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _reloaded(opt: torch.optim.Optimizer, model: torch.nn.Module) -> torch.optim.Optimizer:
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    fresh.load_state_dict(opt.state_dict())
    return fresh


def test_tied_weights_map_to_one_new_parameter(replacing_conversion: None) -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = ParameterMap.snapshot(model)
    groups = tied_groups(model)
    assert groups == [["0.weight", "1.weight"]]
    model.to(torch.float64)
    assert model[0].weight is not model[1].weight  # the conversion unties them
    retie(model, groups)
    mapping = ParameterMap()
    mapping.record(before, model)
    mapping.repoint(opt)
    assert opt.param_groups[0]["params"] == [model[0].weight]
    assert model[0].weight is model[1].weight


def test_untouched_optimizer_is_left_alone() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = ParameterMap.snapshot(model)
    model.to(torch.float64)  # in place: the same Parameter objects
    mapping = ParameterMap()
    assert mapping.record(before, model) == 0
    assert mapping.repoint(opt) == 0
