"""Checkpoints of IPEX-optimized training on real IPEX: what is written (fp32 masters in the
public layout) and exact resume, for fp32 with prepacked weights and for bf16 with split masters."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.checkpoint.state import load_torch
from accel.state import AcceleratorState, GradientState
from ipex_models import Net, batch
from safetensors.torch import load_file
from torch import nn

HALF = 3


def run(acc: Accelerator, model: nn.Module, opt: torch.optim.Optimizer, sched: object, steps: range) -> None:
    for step in steps:
        x, y = batch(step)
        acc.backward(nn.functional.mse_loss(model(x).float(), y))
        opt.step()
        sched.step()  # type: ignore[attr-defined]
        opt.zero_grad()


def fresh(precision: str, seed: int) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer, object]:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(adapter="ipex", mixed_precision=precision.removesuffix("-prepack"))
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return acc, *acc.prepare(model, opt, sched)


@pytest.mark.parametrize("precision", ["no", "bf16", "bf16-prepack"])
def test_save_state_holds_fp32_masters_and_resumes_exactly(
    precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if precision == "bf16-prepack":
        from accel_ipex import ipex

        if not ipex.bf16_prepack_supported():
            pytest.skip("this CPU cannot prepack bf16 weights (needs avx_ne_convert or avx512bw/vl/dq)")
        monkeypatch.setenv("ACCEL_IPEX_WEIGHTS_PREPACK", "1")
    acc, model, opt, sched = fresh(precision, seed=0)
    run(acc, model, opt, sched, range(HALF))
    saved_at = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.save_state(tmp_path / "ckpt")
    run(acc, model, opt, sched, range(HALF, 2 * HALF))
    uninterrupted = {k: v.clone() for k, v in acc.get_state_dict(model).items()}

    weights = load_file(tmp_path / "ckpt" / "model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.float32}
    assert weights.keys() == Net().state_dict().keys()
    for name, value in saved_at.items():
        assert torch.equal(weights[name], value), name
    if precision != "no":
        # The file holds the masters, not bf16 parameters cast up.
        w = weights["fc1.weight"]
        assert not torch.equal(w, w.to(torch.bfloat16).float())
    # Optimizer moments are written in the parameters' public shapes (IPEX unpacks them).
    shapes = [tuple(v.shape) for v in Net().state_dict().values()]
    state = load_torch(tmp_path / "ckpt" / "optimizer.bin")["state"]
    assert [tuple(state[i]["exp_avg"].shape) for i in range(len(shapes))] == shapes

    # A new run from other weights, loading the checkpoint, continues bit for bit.
    acc, model, opt, sched = fresh(precision, seed=1)
    acc.load_state(tmp_path / "ckpt")
    for name, value in acc.get_state_dict(model).items():
        assert torch.equal(value, saved_at[name]), name
    run(acc, model, opt, sched, range(HALF, 2 * HALF))
    resumed = acc.get_state_dict(model)
    for name, value in uninterrupted.items():
        assert torch.equal(resumed[name], value), name


@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_save_model_loads_strictly_into_a_plain_module(precision: str, tmp_path: Path) -> None:
    acc, model, opt, sched = fresh(precision, seed=0)
    run(acc, model, opt, sched, range(HALF))
    acc.save_model(model, tmp_path / "out")
    plain = Net()
    plain.load_state_dict(load_file(tmp_path / "out" / "model.safetensors"), strict=True)
    x = torch.randn(4, 16)
    with torch.no_grad():
        expected = copy.deepcopy(plain)(x)
        # The unwrapped IPEX model computes in bf16 under bf16, so compare loosely there.
        got = model(x).float()
    tol = {"rtol": 1e-5, "atol": 1e-5} if precision == "no" else {"rtol": 0.05, "atol": 0.05}
    torch.testing.assert_close(got, expected, **tol)
