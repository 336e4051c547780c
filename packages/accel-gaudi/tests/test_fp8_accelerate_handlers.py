"""Accelerate's fp8 recipe handlers (`accel.utils.TERecipeKwargs`, `FP8RecipeKwargs`, `AORecipeKwargs`) and the
launcher's `ACCELERATE_FP8_*` settings on emulated Gaudi: each field reaches Habana's recipe over Gaudi's
defaults, or is refused by name; Gaudi1 falls back to bf16 with Accelerate's warning."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.errors import FP8RecipeError
from accel.state import AcceleratorState
from accel.utils import AORecipeKwargs, FP8RecipeKwargs, TERecipeKwargs
from accel_gaudi import GaudiFP8RecipeKwargs, hpu_emulated
from torch import nn


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def prepared(*handlers: Any) -> nn.Module:
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8", kwargs_handlers=list(handlers))
    return acc.prepare(mlp())


GAUDI_DEFAULT = GaudiFP8RecipeKwargs().recipe(hpu_emulated)

FIELDS = [
    ("fp8_format", "E5M2", "E5M2"),
    ("margin", 2, 2),
    ("interval", 4, 4),
    ("amax_history_len", 5, 5),
    ("amax_compute_algo", "max", "max"),
]


@pytest.mark.parametrize("kind", [TERecipeKwargs, FP8RecipeKwargs])
@pytest.mark.parametrize(("field", "value", "expected"), FIELDS)
def test_each_field_reaches_habanas_recipe(kind: type, field: str, value: Any, expected: Any) -> None:
    recipe = prepared(kind(**{field: value}))._accel_fp8_recipe
    assert getattr(recipe, field) == expected != getattr(GAUDI_DEFAULT, field)


def test_fields_left_unset_keep_gaudis_defaults() -> None:
    recipe = prepared(FP8RecipeKwargs(margin=2))._accel_fp8_recipe
    assert (recipe.margin, recipe.interval, recipe.amax_history_len, recipe.reduce_amax) == (2, 16, 1, False)


def test_use_autocast_during_eval_decides_whether_eval_runs_in_fp8() -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    for eval_too, fp8_in_eval in ((False, False), (None, True), (True, True)):  # unset: Gaudi's way, fp8
        model = prepared(TERecipeKwargs(use_autocast_during_eval=eval_too)).eval()
        with torch.no_grad():
            assert torch.equal(model(x), mlp()(x)) is not fp8_in_eval, eval_too


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (
            TERecipeKwargs(fp8_format="E4M3"),
            r"^TERecipeKwargs\(fp8_format=\) = 'E4M3': Gaudi runs fp8 as HYBRID or E5M2",
        ),
        (
            TERecipeKwargs(use_mxfp8_block_scaling=True),
            r"^TERecipeKwargs\(use_mxfp8_block_scaling=\) = True: MXFP8 block scaling is not available on HPU\.$",
        ),
        (
            TERecipeKwargs(override_linear_precision=(False, False, True)),
            r"^TERecipeKwargs\(override_linear_precision=\) = \(False, False, True\): accel-gaudi runs every GEMM",
        ),
        (AORecipeKwargs(), r"^AORecipeKwargs = 'ao': torchao float8 training does not run on Gaudi"),
        (FP8RecipeKwargs(backend="ao"), r"^FP8RecipeKwargs\(backend=\) = 'ao': torchao float8 training does not run"),
    ],
)
def test_what_habanas_engine_cannot_run_is_refused_by_name(handler: Any, message: str) -> None:
    with pytest.raises(FP8RecipeError, match=message):
        prepared(handler)


def test_launcher_settings_apply_and_the_code_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_MARGIN", "3")
    monkeypatch.setenv("ACCELERATE_FP8_FORMAT", "E5M2")
    assert (prepared()._accel_fp8_recipe.margin, prepared()._accel_fp8_recipe.fp8_format) == (3, "E5M2")
    assert prepared(TERecipeKwargs(margin=1))._accel_fp8_recipe.margin == 1
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "msamp")
    with pytest.raises(FP8RecipeError, match=r"^ACCEL_FP8_BACKEND = 'msamp': MS-AMP does not run on Gaudi"):
        prepared()


def test_gaudis_own_handler_and_an_accelerate_one_together_are_refused() -> None:
    with pytest.raises(ValueError, match=r"GaudiFP8RecipeKwargs and TERecipeKwargs both set the fp8 recipe"):
        prepared(GaudiFP8RecipeKwargs(), TERecipeKwargs())


def test_gaudi1_warns_and_trains_bf16_as_accelerate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ACCEL_GAUDI_EMULATED_DEVICE", "GAUDI")
    with caplog.at_level(logging.WARNING, logger="accel"):
        acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8")
    assert acc.mixed_precision == "bf16"
    assert "The current HPU device is Gaudi1 which does not support FP8 mixed precision training" in caplog.text
    assert "Will use BF16 instead." in caplog.text
    model = acc.prepare(mlp())
    assert not any(hpu_emulated.is_fp8_linear(m) for m in model.modules())


def test_a_recipe_handler_reaches_the_fp8_option_under_bf16_and_is_refused_without_fp8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match=r"^Passing in an FP8 configuration requires setting `mixed_precision='fp8'`"):
        Accelerator(adapter="gaudi", emulate=True, mixed_precision="bf16", kwargs_handlers=[TERecipeKwargs(margin=2)])
    AcceleratorState._reset_state(reset_partial_state=True)  # the adapter reads its options when it is built
    monkeypatch.setenv("ACCEL_GAUDI_FP8", "1")
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="bf16", kwargs_handlers=[TERecipeKwargs(margin=2)])
    assert acc.prepare(mlp())._accel_fp8_recipe.margin == 2
