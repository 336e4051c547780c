"""`accel.precision.fp8_emulation`: fp8 rounding and per-tensor scales, checked against hand-written references."""

from __future__ import annotations

import pytest
import torch
from accel.precision import fp8_emulation as f8
from torch import nn


def test_quantize_rounds_to_the_format_and_saturates() -> None:
    e4m3 = torch.float8_e4m3fn
    x = torch.tensor([1.0, 1.0625, 1.1, 1000.0, -1000.0])
    q = f8.quantize(x, torch.tensor(1.0), e4m3)
    # e4m3 has 3 mantissa bits: 1.0625 ties to 1.0, 1.1 rounds to 1.125; 448 is its largest value.
    assert q.tolist() == [1.0, 1.0, 1.125, 448.0, -448.0]
    scale = torch.tensor(448.0 / 1000.0)
    assert f8.quantize(torch.tensor([1000.0]), scale, e4m3).item() == pytest.approx(1000.0)


def test_dynamic_linear_equals_quantised_matmul_and_backward() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    layer = f8.Float8Linear(linear, recipe=f8.Float8Recipe(scaling="dynamic"))
    assert layer.weight is linear.weight and layer.bias is linear.bias
    x = torch.randn(4, 16, requires_grad=True)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def q(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return f8.quantize(t, torch.finfo(dtype).max / t.abs().max(), dtype)

    xq, wq = q(x.detach(), e4m3), q(linear.weight.detach(), e4m3)
    out = layer(x)
    assert torch.equal(out, xq @ wq.t() + linear.bias.detach())
    grad = torch.randn(4, 8)
    out.backward(grad)
    gq = q(grad, e5m2)  # HYBRID: gradients in e5m2
    assert torch.equal(x.grad, gq @ wq)
    assert torch.equal(linear.weight.grad, gq.t() @ xq)
    assert torch.equal(linear.bias.grad, grad.sum(0))


def test_delayed_scaling_uses_the_previous_amax() -> None:
    recipe = f8.Float8Recipe(scaling="delayed", amax_history_len=4)
    state = f8.ScalingState()
    fmax = torch.finfo(torch.float8_e4m3fn).max
    assert state.scale_for(torch.tensor([2.0]), torch.float8_e4m3fn, recipe) == fmax / 2.0  # first step: own amax
    assert state.scale_for(torch.tensor([8.0]), torch.float8_e4m3fn, recipe) == fmax / 2.0  # the step before's
    assert state.scale_for(torch.tensor([1.0]), torch.float8_e4m3fn, recipe) == fmax / 8.0


def test_without_a_recipe_the_layer_is_fp8_only_inside_fp8_autocast() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    layer = f8.Float8Linear(linear)
    x = torch.randn(4, 16)
    assert torch.equal(layer(x), linear(x))
    with f8.fp8_autocast(f8.Float8Recipe()):
        assert not torch.equal(layer(x), linear(x))
    assert f8._active == []


def test_swap_linears_honours_the_filter_and_bad_recipes_are_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4)))
    swapped = f8.swap_linears(model, f8.Float8Linear, lambda m, fqn: fqn != "0")
    assert swapped == 1 and isinstance(model[2][0], f8.Float8Linear) and type(model[0]) is nn.Linear
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        f8.Float8Recipe(fp8_format="E2M1")
    with pytest.raises(ValueError, match="scaling must be one of"):
        f8.Float8Recipe(scaling="static")
