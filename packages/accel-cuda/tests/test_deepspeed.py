"""fp8 under DeepSpeed on emulated CUDA, as Accelerate runs it: the engine in bf16, the model's Linears
converted to the chosen fp8 backend's layers before `deepspeed.initialize`, the forward quantised. Runs in
the `deepspeed` nox session (DeepSpeed's CPU accelerator)."""

from __future__ import annotations

import copy

import pytest

deepspeed = pytest.importorskip("deepspeed")


@pytest.mark.parametrize("backend", ["te", "ao"])
def test_fp8_under_deepspeed_converts_the_model_before_the_bf16_engine(backend: str) -> None:
    import torch
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin
    from accel.utils import AORecipeKwargs, TERecipeKwargs
    from accel_cuda import cuda_emulated
    from torch import nn

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    handler = TERecipeKwargs(margin=2) if backend == "te" else AORecipeKwargs()
    acc = Accelerator(
        adapter="cuda",
        emulate=True,
        mixed_precision="fp8",
        kwargs_handlers=[handler],
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=1),
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
    plain = copy.deepcopy(model).to(torch.bfloat16)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=4)
    engine, opt, _ = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), loader)
    assert engine.bfloat16_enabled() and not engine.fp16_enabled()
    inner = engine.module
    is_fp8 = cuda_emulated.is_te_linear if backend == "te" else cuda_emulated.is_ao_linear
    assert is_fp8(inner[0]) and is_fp8(inner[2]), [type(m) for m in inner]
    if backend == "te":
        assert inner._accel_te_recipe.margin == 2  # the handler's recipe, not the default
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        fp8_out, bf16_out = engine(x).float(), plain(x).float()
    assert not torch.equal(fp8_out, bf16_out) and torch.allclose(fp8_out, bf16_out, atol=0.15, rtol=0.15)
    before = [p.detach().float().clone() for p in engine.parameters()]
    acc.backward(engine(x).float().pow(2).mean())
    opt.step()
    assert any(not torch.equal(b, p.detach().float()) for b, p in zip(before, engine.parameters()))
