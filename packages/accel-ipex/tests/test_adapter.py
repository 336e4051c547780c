"""The IPEX adapter in one process on real intel-extension-for-pytorch: selection, device and
backend, ipex.optimize for training (every reference re-pointed) and evaluation, bf16 with
the CPU-dependent prepack choice, and the errors."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from accel import Accelerator
from accel.adapter.registry import select_adapter
from accel_ipex import IpexAdapter
from ipex_models import Net, batch
from torch import nn

STEPS = 6


def make(model: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)


def reference_training(start: nn.Module, bf16: bool = False) -> dict[str, torch.Tensor]:
    """Plain PyTorch: fp32 weights (bf16 autocast when asked), same optimizer and schedule."""
    model = copy.deepcopy(start)
    opt, sched = make(model)
    for step in range(STEPS):
        x, y = batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        nn.functional.mse_loss(out.float(), y).backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def accel_training(acc: Accelerator, model: nn.Module) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    opt, sched = make(model)
    model, opt, sched = acc.prepare(model, opt, sched)
    for step in range(STEPS):
        x, y = batch(step)
        acc.backward(nn.functional.mse_loss(model(x).float(), y))
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


# ---- selection, device, backend -------------------------------------------------------------
def test_ipex_is_chosen_over_cpu_when_installed_with_its_torch() -> None:
    assert select_adapter(None) is IpexAdapter
    acc = Accelerator()
    assert acc.adapter.name == "ipex"
    assert acc.device == torch.device("cpu")
    # No oneCCL bindings on the registry, so the CPU collective backend is gloo.
    assert acc.adapter.vendor.ccl_available() is False
    assert acc.adapter.backend == "gloo"
    assert "intel-extension-for-pytorch 2.8.0" in IpexAdapter.availability().reason


def test_no_xpu_here_and_emulation_keeps_cpu_and_gloo() -> None:
    real, emulated = IpexAdapter(), IpexAdapter(emulate=True)
    assert real.on_xpu is False and real.device_type == "cpu"
    assert (emulated.device_type, emulated.backend) == ("cpu", "gloo")
    assert real.get_device_rng_state() is None


def test_fp16_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError) as info:
        Accelerator(adapter="ipex", mixed_precision="fp16")
    assert "The 'ipex' adapter does not support mixed_precision='fp16'; it supports ['bf16', 'no']" in str(info.value)


# ---- training --------------------------------------------------------------------------------
@pytest.mark.parametrize("prepack", [True, False], ids=["prepack", "no-prepack"])
def test_fp32_training_matches_plain_pytorch_and_everything_points_at_the_new_parameters(
    prepack: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    start = Net()
    expected = reference_training(start)
    monkeypatch.setenv("ACCEL_IPEX_WEIGHTS_PREPACK", "1" if prepack else "0")
    acc = Accelerator(adapter="ipex")
    user_model = copy.deepcopy(start)
    before = list(user_model.parameters())  # held, so no new parameter can reuse an old id
    with warnings.catch_warnings():
        # IPEX's fused step must not hide the step from the scheduler built before prepare.
        warnings.filterwarnings("error", message=".*optimizer.step.*", category=UserWarning)
        model, opt, sched = accel_training(acc, user_model)

    # IPEX's prepacked layers also hold empty placeholder parameters that nothing trains.
    params = [p for p in model.parameters() if p.requires_grad]
    in_optimizer = [p for g in opt.optimizer.param_groups for p in g["params"]]
    assert [id(p) for p in params] == [id(p) for p in in_optimizer]
    assert getattr(opt.optimizer, "fused", False) is True  # IPEX's fused SGD step is the one that runs
    # In place, IPEX keeps the user's Parameter objects and swaps what they hold: the conv's
    # weight now lives in oneDNN's blocked layout (fp32 Linear stays torch's in training).
    assert type(model.conv).__name__ == ("_IPEXConv2d" if prepack else "Conv2d")
    assert [id(p) for p in params] == [id(p) for p in before]
    assert model.conv.weight.dim() == (5 if prepack else 4)
    # The scheduler drives the very optimizer that updates the parameters forward uses.
    assert sched.scheduler.optimizer is opt.optimizer
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5**STEPS)
    got = acc.get_state_dict(model)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_bf16_training_keeps_fp32_masters_and_tracks_autocast_reference() -> None:
    torch.manual_seed(0)
    start = Net()
    expected = reference_training(start, bf16=True)
    acc = Accelerator(adapter="ipex", mixed_precision="bf16")
    model, opt, _ = accel_training(acc, copy.deepcopy(start))
    assert acc.adapter.weights_prepack("bf16") is acc.adapter.bf16_prepack_supported()
    # IPEX trains bf16 parameters with the fp32 master split off; forward runs under autocast.
    trained = [p for p in model.parameters() if p.requires_grad]
    assert {p.dtype for p in trained} == {torch.bfloat16}
    assert [id(p) for p in trained] == [id(p) for g in opt.optimizer.param_groups for p in g["params"]]
    got = acc.get_state_dict(model)
    assert {v.dtype for v in got.values()} == {torch.float32}
    # Masters carry bits a bf16 number cannot: they are not the bf16 parameters cast up.
    weight = got["fc1.weight"]
    assert not torch.equal(weight, weight.to(torch.bfloat16).float())
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0.05, atol=0.01, msg=name)


def test_bf16_prepack_override_on_this_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forcing prepack on for bf16: trains where the CPU supports it, a clear error where it does not."""
    torch.manual_seed(0)
    start = Net()
    monkeypatch.setenv("ACCEL_IPEX_WEIGHTS_PREPACK", "on")
    acc = Accelerator(adapter="ipex", mixed_precision="bf16")
    if acc.adapter.bf16_prepack_supported():
        model, _, _ = accel_training(acc, copy.deepcopy(start))
        assert type(model.fc1).__name__ == "_IPEXLinear" and type(model.conv).__name__ == "_IPEXConv2d"
        torch.testing.assert_close(
            acc.get_state_dict(model)["fc1.weight"], reference_training(start, True)["fc1.weight"], rtol=0.05, atol=0.01
        )
    else:
        model = copy.deepcopy(start)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(RuntimeError, match=r"this CPU cannot prepack bf16 weights.*set it to off"):
            acc.prepare(model, opt)


def test_adamw_state_follows_the_new_parameters() -> None:
    torch.manual_seed(0)
    start = Net()
    ref = copy.deepcopy(start)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    acc = Accelerator(adapter="ipex")
    model = copy.deepcopy(start)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    for step in range(STEPS):
        x, y = batch(step)
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    assert set(opt.optimizer.state) == {p for p in model.parameters() if p.requires_grad}
    for name, value in ref.state_dict().items():
        torch.testing.assert_close(acc.get_state_dict(model)[name], value, rtol=1e-5, atol=1e-6, msg=name)


# ---- evaluation and the cases IPEX cannot optimize -------------------------------------------------
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_evaluation_mode_prepare_runs_ipex_inference_optimize(precision: str) -> None:
    torch.manual_seed(0)
    reference = Net().eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        expected = reference(x)
    acc = Accelerator(adapter="ipex", mixed_precision=precision)
    model = acc.prepare_model(copy.deepcopy(reference).train(), evaluation_mode=True)
    assert not model.training
    with torch.no_grad():
        got = model(x).float()
    if precision == "no":
        # Inference prepacks Linear layers too (and the conv).
        assert type(model.fc1).__name__ == "_IPEXLinear" and type(model.conv).__name__ == "_IPEXConv2d"
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert model.fc1.weight.dtype == torch.bfloat16
        torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)


def test_training_model_without_its_optimizer_is_left_alone_with_a_warning() -> None:
    acc = Accelerator(adapter="ipex")
    model = Net()
    before = [id(p) for p in model.parameters()]
    with pytest.warns(UserWarning, match="without its optimizer, so ipex.optimize is skipped"):
        prepared = acc.prepare(model)
    assert [id(p) for p in prepared.parameters()] == before


def test_one_optimizer_over_two_models_is_refused() -> None:
    acc = Accelerator(adapter="ipex")
    a, b = Net(), Net()
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="One optimizer holds parameters of two models"):
        acc.prepare(a, b, opt)


def test_two_optimizers_over_one_model_are_refused() -> None:
    acc = Accelerator(adapter="ipex")
    model = Net()
    first = torch.optim.SGD(model.fc1.parameters(), lr=0.1)
    rest = torch.optim.SGD([*model.conv.parameters(), *model.head.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="2 optimizers in this `prepare` call hold parameters of the same model"):
        acc.prepare(model, first, rest)


def test_optimize_off_keeps_plain_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_IPEX_OPTIMIZE", "0")
    acc = Accelerator(adapter="ipex")
    model = Net()
    before = [id(p) for p in model.parameters()]
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert [id(p) for p in model.parameters()] == before and type(model.conv) is nn.Conv2d
    assert "optimize=False" in acc.adapter.describe()


def test_data_parallel_runs_report_accelerates_names(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.distributed.distributed_type import DistributedType

    adapter = IpexAdapter()
    monkeypatch.setattr(IpexAdapter, "on_xpu", property(lambda self: True))  # several processes on Intel GPUs
    assert adapter.data_parallel_type(True) == DistributedType.MULTI_XPU
    assert adapter.data_parallel_type(False) == DistributedType.NO
    monkeypatch.setattr(IpexAdapter, "on_xpu", property(lambda self: False))
    assert adapter.data_parallel_type(True) == DistributedType.MULTI_CPU
