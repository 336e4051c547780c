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


def test_regional_compilation_compiles_each_repeated_block_and_the_rest_as_regions_of_a_copy() -> None:
    """Accelerate's `compile_regions`: each block of a repeated ModuleList, and the other subtrees (the head) on
    their own, in a copy of the model sharing its parameters; the user's model stays as it was."""
    plugin = TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True)
    acc = Accelerator(adapter="cuda", emulate=True, dynamo_plugin=plugin)
    original = Blocks()
    model = acc.prepare(original)
    assert model is not original and not is_compiled_module(model)
    assert [is_compiled_module(b) for b in model.blocks] == [True, True, True]
    assert is_compiled_module(model.head)
    assert not any(is_compiled_module(m) for m in original.modules())  # the user's module is untouched
    assert acc.unwrap_model(model, keep_torch_compile=False) is original
    assert list(acc.get_state_dict(model)) == list(Blocks().state_dict())  # no `_orig_mod.` in the names
    x = torch.randn(4, 16)
    assert_close(model(x), Blocks()(x))
    assert acc.prepare(model) is model  # compiled once


def test_reduce_overhead_mode_reaches_torch_compile(emulate: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA graphs in Accelerate are `mode="reduce-overhead"`: it reaches torch.compile as given."""
    seen: list[dict] = []
    real_compile = torch.compile

    def recording_compile(model, **kwargs):
        seen.append(kwargs)
        return real_compile(model, **kwargs)

    monkeypatch.setattr(torch, "compile", recording_compile)
    plugin = TorchDynamoPlugin(backend="inductor", mode="reduce-overhead")
    acc = Accelerator(adapter="cuda", emulate=emulate, dynamo_plugin=plugin)
    model = acc.prepare(Blocks())
    assert [(k["backend"], k["mode"]) for k in seen] == [("inductor", "reduce-overhead")]
    if not emulate:  # on a GPU the step replays a CUDA graph; the numbers stay eager's
        x = torch.randn(8, 16, device=acc.device)
        expected = Blocks().to(acc.device)(x)
        for _ in range(3):
            out = model(x)
        assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_no_backend_means_no_compilation() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    assert not is_compiled_module(acc.prepare(Blocks()))
