"""Accelerate's fp8 recipe handlers (`accel.utils.TERecipeKwargs`, `AORecipeKwargs`, `FP8RecipeKwargs`) and
the launcher's `ACCELERATE_FP8_*` settings on emulated CUDA: each field changes what is built (the recipe,
the converted layers, torchao's config, the backend), or is refused by name; a GPU without fp8 falls back to
fp16 with Accelerate's warning."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.errors import FP8RecipeError, SettingError
from accel.utils import AORecipeKwargs, FP8RecipeKwargs, TERecipeKwargs
from accel_cuda import cuda_emulated
from accel_cuda import fp8 as cuda_fp8
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.out = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(self.inp(x)))


def prepared(*handlers: Any, **kwargs: Any) -> nn.Module:
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8", kwargs_handlers=list(handlers), **kwargs)
    return acc.prepare(Net())


def converted(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if cuda_emulated.is_te_linear(m) or cuda_emulated.is_ao_linear(m)]


DEFAULT_RECIPE = cuda_fp8.TERecipeKwargs().recipe(cuda_emulated)

TE_FIELDS = [
    ("fp8_format", "E4M3", "fp8_format", "E4M3"),
    ("fp8_format", "e5m2", "fp8_format", "E5M2"),
    ("margin", 3, "margin", 3),
    ("interval", 5, "interval", 5),
    ("amax_history_len", 7, "amax_history_len", 7),
    ("amax_compute_algo", "MAX", "amax_compute_algo", "max"),
    ("override_linear_precision", (False, False, True), "override_linear_precision", (False, False, True)),
]


@pytest.mark.parametrize("kind", [TERecipeKwargs, FP8RecipeKwargs])
@pytest.mark.parametrize(("field", "value", "attr", "expected"), TE_FIELDS)
def test_each_te_field_reaches_the_recipe(kind: type, field: str, value: Any, attr: str, expected: Any) -> None:
    model = prepared(kind(**{field: value}))
    assert model._accel_fp8_backend == "te"
    assert getattr(model._accel_te_recipe, attr) == expected != getattr(DEFAULT_RECIPE, attr)


def test_the_issues_recipe_trains_with_its_own_values() -> None:
    recipe = prepared(TERecipeKwargs(fp8_format="E4M3", margin=3, amax_history_len=7))._accel_te_recipe
    assert (recipe.fp8_format, recipe.margin, recipe.amax_history_len) == ("E4M3", 3, 7)


def test_mxfp8_block_scaling_builds_the_block_recipe_or_is_refused_by_name() -> None:
    recipe = prepared(TERecipeKwargs(use_mxfp8_block_scaling=True, margin=1))._accel_te_recipe
    assert (recipe.block_scaling, recipe.scaling, recipe.margin) == (True, "dynamic", 1)
    assert DEFAULT_RECIPE.block_scaling is False
    with pytest.raises(FP8RecipeError, match=r"use_mxfp8_block_scaling=True takes no amax_history_len"):
        prepared(TERecipeKwargs(use_mxfp8_block_scaling=True, amax_history_len=16))
    cuda_emulated.mxfp8["supported"] = False
    with pytest.raises(
        FP8RecipeError,
        match=r"^TERecipeKwargs\(use_mxfp8_block_scaling=\) = True: MXFP8 block scaling is not available: "
        r"the emulated GPU stands for one before Blackwell\.$",
    ):
        prepared(TERecipeKwargs(use_mxfp8_block_scaling=True))
    cuda_emulated.mxfp8["supported"] = True


def test_override_linear_precision_transformer_engine_lacks_is_refused() -> None:
    with pytest.raises(FP8RecipeError, match=r"^TERecipeKwargs: override_linear_precision=\(True, False, False\)"):
        prepared(TERecipeKwargs(override_linear_precision=(True, False, False)))


def test_use_autocast_during_eval_decides_whether_eval_runs_in_fp8() -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = Net()(x).float()
    for eval_too in (True, False):
        model = prepared(TERecipeKwargs(use_autocast_during_eval=eval_too)).eval()
        with torch.no_grad():
            assert torch.equal(model(x), bf16) is not eval_too, eval_too


def test_ao_handler_module_filter_decides_which_layers_convert() -> None:
    assert converted(prepared(AORecipeKwargs(module_filter_func=lambda m, fqn: False))) == []
    model = prepared(AORecipeKwargs(module_filter_func=lambda m, fqn: fqn == "mid.2"))
    assert model._accel_fp8_backend == "ao"
    assert converted(model) == ["mid.2"]


def test_ao_switches_default_on_as_in_accelerate_and_follow_the_handler() -> None:
    config = prepared(AORecipeKwargs())._accel_ao_config
    assert (config.pad_inner_dim, config.enable_fsdp_float8_all_gather) == (True, True)
    config = prepared(AORecipeKwargs(pad_inner_dim=False, enable_fsdp_float8_all_gather=False))._accel_ao_config
    assert (config.pad_inner_dim, config.enable_fsdp_float8_all_gather) == (False, False)
    mine = cuda_emulated.Float8LinearConfig(fp8_format="E4M3")
    assert prepared(AORecipeKwargs(config=mine))._accel_ao_config is mine


class Odd(nn.Module):
    """An inner dimension of 20: fp8 GEMMs need it padded to a multiple of 16."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(20, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


@pytest.mark.parametrize("pad", [True, False])
def test_pad_inner_dim_decides_whether_an_odd_inner_dimension_runs(pad: bool) -> None:
    handler = AORecipeKwargs(module_filter_func=lambda m, fqn: True, pad_inner_dim=pad)
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8", kwargs_handlers=[handler])
    model = acc.prepare(Odd())
    assert converted(model) == ["proj"]
    x = torch.randn(4, 20)
    if pad:
        assert model(x).shape == (4, 32)
    else:
        with pytest.raises(RuntimeError, match="divisible by 16"):
            model(x)


def test_fp8_recipe_kwargs_backend_chooses_the_backend() -> None:
    assert prepared(FP8RecipeKwargs(backend="ao"))._accel_fp8_backend == "ao"
    assert prepared(FP8RecipeKwargs(backend="te"))._accel_fp8_backend == "te"
    with pytest.raises(ValueError, match=r"FP8RecipeKwargs\(backend='AO'\) with margin: these fields configure"):
        prepared(FP8RecipeKwargs(backend="ao", margin=2))


def test_launcher_backend_and_fields_apply_and_the_code_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "ao")
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    assert acc.fp8_backend == "AO"
    assert acc.prepare(Net())._accel_fp8_backend == "ao"
    assert prepared(TERecipeKwargs())._accel_fp8_backend == "te"  # the handler in code wins
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "te")
    monkeypatch.setenv("ACCEL_FP8_MARGIN", "4")
    monkeypatch.setenv("ACCEL_FP8_OVERRIDE_WGRAD", "true")
    recipe = prepared()._accel_te_recipe
    assert (recipe.margin, recipe.override_linear_precision) == (4, (False, False, True))
    assert prepared(TERecipeKwargs(margin=1))._accel_te_recipe.margin == 1
    monkeypatch.setenv("ACCEL_FP8_MARGIN", "four")
    with pytest.raises(SettingError, match=r"^ACCEL_FP8_MARGIN: expected a whole number, got 'four'\.$"):
        Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")


def test_msamp_and_conflicting_handlers_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"Pass one fp8 recipe handler, got TERecipeKwargs and AORecipeKwargs"):
        prepared(TERecipeKwargs(), AORecipeKwargs())
    with pytest.raises(ValueError, match=r"accel_cuda.TERecipeKwargs and AORecipeKwargs both choose the fp8 recipe"):
        prepared(cuda_fp8.TERecipeKwargs(), AORecipeKwargs())
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "msamp")
    acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    with pytest.raises(FP8RecipeError, match=r"^ACCEL_FP8_BACKEND = 'msamp': MS-AMP is not supported by accel-cuda"):
        acc.prepare(Net())


def test_a_gpu_without_fp8_warns_and_trains_fp16_as_accelerate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(cuda_emulated, "fp8_hardware_supported", lambda: (False, "Tesla V100 (compute capability 7.0)"))
    with caplog.at_level(logging.WARNING, logger="accel"):
        acc = Accelerator(adapter="cuda", emulate=True, mixed_precision="fp8")
    assert acc.mixed_precision == "fp16"
    assert acc.scaler is not None
    assert "(Tesla V100 (compute capability 7.0)) has a compute capability insufficient for FP8" in caplog.text
    assert "Will use FP16 instead." in caplog.text
    assert converted(acc.prepare(Net())) == []


def test_a_recipe_handler_without_fp8_is_refused_as_in_accelerate() -> None:
    with pytest.raises(
        ValueError, match=r"^Passing in an FP8 configuration requires setting `mixed_precision='fp8'`\.$"
    ):
        Accelerator(adapter="cuda", emulate=True, mixed_precision="bf16", kwargs_handlers=[TERecipeKwargs(margin=2)])
