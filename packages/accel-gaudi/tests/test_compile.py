"""Compilation: the adapter's backend, applied last and once; regional compilation per block; refused in lazy
mode; optimum-habana's dynamo knobs. Compiling tests run in eager mode (`PT_HPU_LAZY_MODE=0`), as on Gaudi."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo.config as dynamo_config
from accel import Accelerator, TorchDynamoPlugin
from accel.errors import CompileNotSupportedError
from accel.prepare.wrappers import is_compiled_module
from accel_gaudi import hpu_emulated
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_emulated_backend_is_inductor_and_comes_from_the_vendor_module():
    adapter = Accelerator(adapter="gaudi", emulate=True).adapter
    assert adapter.compile_backend() == "inductor" == hpu_emulated.COMPILE_BACKEND


def test_an_already_compiled_model_is_not_compiled_again(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    acc = Accelerator(adapter="gaudi", emulate=True, dynamo_backend="eager")
    compiled = torch.compile(nn.Linear(2, 2), backend="eager")
    assert acc.prepare(compiled) is compiled


def test_regional_compilation_compiles_each_block_once_and_matches_eager(monkeypatch):
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def counting_inductor(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    # The emulated default backend (inductor), counted.
    monkeypatch.setattr(hpu_emulated, "COMPILE_BACKEND", counting_inductor)
    monkeypatch.setenv("ACCEL_GAUDI_USE_REGIONAL_COMPILATION", "1")
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Net()
    eager = copy.deepcopy(model)
    acc = Accelerator(adapter="gaudi", emulate=True)  # no dynamo backend: the flag implies compilation
    prepared = acc.prepare(model)
    assert prepared is model and not is_compiled_module(prepared)
    assert all(is_compiled_module(b) for b in prepared.blocks)
    assert not is_compiled_module(prepared.embed) and not is_compiled_module(prepared.head)

    x1, x2 = torch.randn(5, 4), torch.randn(5, 4)
    with torch.no_grad():
        assert torch.allclose(prepared(x1), eager(x1), atol=1e-5)
        first = len(graphs)
        assert torch.allclose(prepared(x2), eager(x2), atol=1e-5)
    # Three identical blocks: at most one compilation each, none again on the next call.
    assert 1 <= first <= 3 and len(graphs) == first
    torch._dynamo.reset()


@pytest.mark.parametrize("how", ["dynamo_backend", "regional"])
def test_compilation_is_refused_in_lazy_mode(how, monkeypatch):
    # Lazy mode is the bridge's default (PT_HPU_LAZY_MODE unset); optimum-habana asserts it is off to compile.
    kwargs = {"dynamo_backend": "eager"} if how == "dynamo_backend" else {}
    if how == "regional":
        monkeypatch.setenv("ACCEL_GAUDI_USE_REGIONAL_COMPILATION", "1")
    with pytest.raises(
        CompileNotSupportedError, match=r"^Dynamo and lazy are mutually exclusive: .* PT_HPU_LAZY_MODE=0"
    ):
        Accelerator(adapter="gaudi", emulate=True, **kwargs)


KNOBS = {"cache_size_limit": 1, "allow_unspec_int_on_nn_module": True}


@pytest.fixture
def knobs_restored():
    saved = {name: getattr(dynamo_config, name) for name in KNOBS}
    dynamo_config.allow_unspec_int_on_nn_module = False
    yield
    for name, value in saved.items():
        setattr(dynamo_config, name, value)


def test_dynamo_knobs_leave_torch_dynamo_config_alone_without_compilation(knobs_restored):
    before = dynamo_config.cache_size_limit
    Accelerator(adapter="gaudi", emulate=True, adapter_options=KNOBS).prepare(nn.Linear(2, 2))
    assert (dynamo_config.cache_size_limit, dynamo_config.allow_unspec_int_on_nn_module) == (before, False)


def test_dynamo_knobs_reach_torch_dynamo_config_when_compiling(knobs_restored, monkeypatch):
    graphs = []

    def counting_eager(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(hpu_emulated, "COMPILE_BACKEND", counting_eager)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    torch._dynamo.reset()
    plugin = TorchDynamoPlugin(backend="default", dynamic=False)
    acc = Accelerator(adapter="gaudi", emulate=True, dynamo_plugin=plugin, adapter_options=KNOBS)
    assert (dynamo_config.cache_size_limit, dynamo_config.allow_unspec_int_on_nn_module) == (1, True)
    model = acc.prepare(nn.Linear(3, 2))
    with torch.no_grad():
        for rows in (1, 2, 3):  # static shapes: each new one would recompile; the limit of 1 stops at the first
            assert model(torch.ones(rows, 3)).shape == (rows, 2)
    assert len(graphs) == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("inline", [True, False])
def test_inline_inbuilt_nn_modules_is_set_or_refused_by_name(inline, monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    options = {"inline_inbuilt_nn_modules": inline}
    if not dynamo_config._config["inline_inbuilt_nn_modules"].deprecated:  # a torch where it still works: set
        monkeypatch.setattr(dynamo_config, "inline_inbuilt_nn_modules", not inline)
        Accelerator(adapter="gaudi", emulate=True, dynamo_backend="eager", adapter_options=options)
        assert dynamo_config.inline_inbuilt_nn_modules is inline
    elif inline:  # torch >= 2.10 always inlines torch's modules: True is what it does
        Accelerator(adapter="gaudi", emulate=True, dynamo_backend="eager", adapter_options=options)
    else:  # and cannot honour False
        with pytest.raises(CompileNotSupportedError, match=r"^inline_inbuilt_nn_modules=False: torch .* no longer has"):
            Accelerator(adapter="gaudi", emulate=True, dynamo_backend="eager", adapter_options=options)


def _symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether dynamo traced `gm` with symbolic (dynamic) input shapes."""
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    return any(isinstance(s, torch.SymInt) for v in values if isinstance(v, torch.Tensor) for s in v.shape)


@pytest.mark.parametrize("source", ["plugin", "accelerate_env"])
@pytest.mark.parametrize(("mode", "dynamic"), [("max-autotune-no-cudagraphs", True), ("reduce-overhead", False)])
def test_compile_mode_and_dynamic_reach_torch_compile(source, mode, dynamic, monkeypatch):
    # optimum-habana's `torch_compile_mode` / `compile_dynamic` go to Accelerate's dynamo plugin; here the
    # plugin's (or ACCELERATE_DYNAMO_MODE / ACCELERATE_DYNAMO_USE_DYNAMIC's) mode and dynamic, as torch.compile
    # hands them to the adapter's backend: `mode` as its keyword, `dynamic` as symbolic shapes in the graph.
    received = []

    def recording_backend(gm, example_inputs, **kwargs):
        received.append((kwargs, _symbolic(gm)))
        return gm.forward

    monkeypatch.setattr(hpu_emulated, "COMPILE_BACKEND", recording_backend)
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    torch._dynamo.reset()
    if source == "plugin":
        acc = Accelerator(
            adapter="gaudi",
            emulate=True,
            dynamo_plugin=TorchDynamoPlugin(backend="default", mode=mode, dynamic=dynamic),
        )
    else:
        monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "default")
        monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", mode)
        monkeypatch.setenv("ACCELERATE_DYNAMO_USE_DYNAMIC", str(dynamic).lower())
        acc = Accelerator(adapter="gaudi", emulate=True)
    model = acc.prepare(nn.Linear(3, 2))
    with torch.no_grad():
        for rows in (4, 5):
            assert model(torch.ones(rows, 3)).shape == (rows, 2)
    # dynamic: one graph for both batch sizes; static: a graph per shape, none symbolic.
    assert received == ([({"mode": mode}, True)] if dynamic else [({"mode": mode}, False)] * 2)
    torch._dynamo.reset()
