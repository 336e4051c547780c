"""torch.compile through the adapter: last in prepare, only once, whole model or region by region.

Emulated, inductor generates C++ for the CPU (the first compile takes seconds here); on a GPU it
generates Triton kernels.
"""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator, TorchDynamoPlugin
from accel.prepare.wrappers import is_compiled_module
from conftest import requires_gpu
from torch import nn
from torch.testing import assert_close


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(3)])
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(params=[True, pytest.param(False, marks=requires_gpu)], ids=["emulated", "gpu"])
def emulate(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_whole_model_compiles_with_inductor_and_matches_eager(emulate: bool) -> None:
    plugin = TorchDynamoPlugin(backend="default", fullgraph=True)
    acc = Accelerator(adapter="cuda", emulate=emulate, dynamo_plugin=plugin, mixed_precision="bf16")
    model = acc.prepare(Blocks())
    assert is_compiled_module(model)
    assert model._orig_mod is acc.unwrap_model(model, keep_torch_compile=False)
    x = torch.randn(8, 16, device=acc.device)
    eager = Blocks().to(acc.device)
    with torch.autocast(acc.device.type, dtype=torch.bfloat16):
        expected = eager(x).float()
    assert_close(model(x), expected, rtol=2e-2, atol=2e-2)
    # Compiled once: preparing the compiled model again returns it unchanged.
    assert acc.prepare(model) is model


def test_regional_compilation_compiles_each_repeated_block() -> None:
    plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True)
    acc = Accelerator(adapter="cuda", emulate=True, dynamo_plugin=plugin)
    model = acc.prepare(Blocks())
    assert not is_compiled_module(model)
    assert [is_compiled_module(b) for b in model.blocks] == [True, True, True]
    assert not is_compiled_module(model.head)
    x = torch.randn(4, 16)
    assert_close(model(x), Blocks()(x))


def test_no_backend_means_no_compilation() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    assert not is_compiled_module(acc.prepare(Blocks()))
