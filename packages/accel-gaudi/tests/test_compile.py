"""Compilation: the adapter's backend, applied last and once; regional compilation per block."""

from __future__ import annotations

import copy

import torch
from accel import Accelerator
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


def test_an_already_compiled_model_is_not_compiled_again():
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
