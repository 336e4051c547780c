"""fp8: backend choice and its errors, TransformerEngine and torchao conversions (their stand-ins
in emulation: real fp8 rounding through `accel.precision.fp8_emulation`), and the real libraries on a GPU
when they are installed."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from accel import Accelerator
from accel.errors import SettingError
from accel.precision import fp8_emulation as f8
from accel_cuda import AORecipeKwargs, FP8BackendError, TERecipeKwargs, cuda_emulated
from conftest import requires_gpu
from torch import nn


class Net(nn.Module):
    """The last layer (1 output) is too small for fp8 GEMMs on purpose; the others are eligible."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(self.inp(x)))


def data(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(16, 16, generator=g).to(device), torch.randn(16, 1, generator=g).to(device)


def test_neither_library_installed_names_both() -> None:
    cuda_emulated.installed_fp8_backends.clear()
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    with pytest.raises(FP8BackendError) as err:
        acc.prepare(Net())
    msg = str(err.value)
    assert "TransformerEngine (`pip install accel-cuda[te]`)" in msg
    assert "torchao (`pip install accel-cuda[ao]`)" in msg
    assert "mixed_precision='bf16'" in msg


def test_a_named_backend_that_is_missing_is_refused() -> None:
    cuda_emulated.installed_fp8_backends.discard("te")
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])
    with pytest.raises(FP8BackendError, match=r"TransformerEngine is not installed.*accel-cuda\[te\]"):
        acc.prepare(Net())


def test_both_handlers_and_bad_env_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = Accelerator(
        adapter="cuda", emulate=True, mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs(), AORecipeKwargs()]
    )
    with pytest.raises(ValueError, match="either TERecipeKwargs or AORecipeKwargs, not both"):
        acc.prepare(Net())
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "fp4")
    with pytest.raises(SettingError, match=r"^ACCEL_FP8_BACKEND: expected one of te, ao, msamp, got 'fp4'\.$"):
        Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        TERecipeKwargs(fp8_format="E3M4")


def test_transformer_engine_is_preferred_and_converts_eligible_linears() -> None:
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    model = Net()
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    assert model._accel_fp8_backend == "te"
    converted = [n for n, m in model.named_modules() if cuda_emulated.is_te_linear(m)]
    assert converted == ["inp", "mid.0", "mid.2"]  # `out` has 1 output row: not a multiple of 16
    assert list(model.parameters()) == params  # same Parameters: the optimizer still trains them
    recipe = model._accel_te_recipe
    assert (recipe.scaling, recipe.fp8_format, recipe.amax_history_len) == ("delayed", "HYBRID", 1024)


def test_te_forward_is_fp8_in_training_and_bf16_in_eval() -> None:
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    model = acc.prepare(Net())
    x, y = data()
    out = model(x)
    assert out.dtype == torch.float32

    ref = Net()
    assert (out - ref(x)).abs().max() < 0.05  # close to fp32...
    assert not torch.equal(out, ref(x))  # ...but rounded

    acc.backward(nn.functional.mse_loss(out, y))
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())

    model.eval()
    with torch.no_grad():
        evaluated = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = ref(x).float()
    assert torch.equal(evaluated, expected)  # no fp8 in eval unless use_autocast_during_eval


def test_te_first_step_scales_by_its_own_amax() -> None:
    # One eligible layer alone, so the reference can be written out by hand.
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    torch.manual_seed(0)
    layer = nn.Linear(16, 16)
    model = acc.prepare(nn.Sequential(layer))
    x = torch.randn(4, 16)
    e4m3 = torch.float8_e4m3fn
    fmax = torch.finfo(e4m3).max
    w = layer.weight.detach()
    expected = (f8.quantize(x, fmax / x.abs().max(), e4m3) @ f8.quantize(w, fmax / w.abs().max(), e4m3).t()) + (
        layer.bias.detach()
    )
    assert torch.equal(model(x), expected)


def test_torchao_skips_first_last_and_small_layers() -> None:
    cuda_emulated.installed_fp8_backends.discard("te")
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    model = acc.prepare(Net())
    assert model._accel_fp8_backend == "ao"
    assert [n for n, m in model.named_modules() if cuda_emulated.is_ao_linear(m)] == ["mid.0", "mid.2"]
    model.eval()
    x, _ = data()
    ref = Net()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = ref(x).float()
    out = model(x)
    assert not torch.equal(out, expected)  # torchao's layers stay fp8 in eval too
    assert (out - expected).abs().max() < 0.05


def test_ao_handler_selects_torchao_with_a_custom_filter() -> None:
    handler = AORecipeKwargs(module_filter_func=lambda m, fqn: fqn == "mid.2")
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8", kwargs_handlers=[handler])
    model = acc.prepare(Net())
    assert [n for n, m in model.named_modules() if cuda_emulated.is_ao_linear(m)] == ["mid.2"]


def test_fp8_training_tracks_fp32_training() -> None:
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    ref = Net()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    x, y = data()
    losses, ref_losses = [], []
    for _ in range(5):
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        ref_loss = nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(loss.item())
        ref_losses.append(ref_loss.item())
    assert losses[-1] < losses[0]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) < 0.05


_HAS_TE = importlib.util.find_spec("transformer_engine") is not None
_HAS_AO = importlib.util.find_spec("torchao") is not None


def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@requires_gpu
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("te", marks=pytest.mark.skipif(not _HAS_TE, reason="TransformerEngine is not installed")),
        pytest.param("ao", marks=pytest.mark.skipif(not _HAS_AO, reason="torchao is not installed")),
    ],
)
def test_real_fp8_trains_on_the_gpu(backend: str) -> None:
    if not _fp8_gpu():
        pytest.skip("this GPU has no fp8 tensor cores (compute capability < 8.9)")
    handler = TERecipeKwargs() if backend == "te" else AORecipeKwargs(module_filter_func=lambda m, fqn: True)
    acc = Accelerator(adapter="cuda", mixed_precision="fp8", kwargs_handlers=[handler])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).to(acc.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    assert model._accel_fp8_backend == backend
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, generator=g).to(acc.device)
    losses = []
    for _ in range(20):
        loss = nn.functional.mse_loss(model(x), x)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
