"""DeepSpeed on Gaudi through the core's DeepSpeed strategy: the adapter's device and backend
reach the engine, and `gradient_clipping` defaults to 1.0 (what Gaudi users get) unless the
user sets it. 2 emulated ranks (`accel launch --adapter gaudi --emulate`) against a
single-process plain-PyTorch reference computed in the worker from the same batches.

Needs DeepSpeed (accel-base's `deepspeed` extra): runs in the `deepspeed` nox session.
"""

from __future__ import annotations

import copy
import os

import pytest
from accel.strategies.deepspeed.config import AcceleratorValues, DeepSpeedPlugin, resolve_config
from accel_gaudi.adapter import DEEPSPEED_GRADIENT_CLIPPING, GaudiAdapter

pytest.importorskip("deepspeed")


def resolved(plugin: DeepSpeedPlugin, adapter: GaudiAdapter) -> dict:
    values = AcceleratorValues(
        micro_batch_size=4,
        gradient_accumulation_steps=1,
        num_processes=2,
        mixed_precision="no",
        has_client_optimizer=True,
    )
    return resolve_config(plugin, values, adapter.strategy_defaults("deepspeed"))


@pytest.mark.parametrize("emulate", [True, False])
def test_clipping_default_is_1_and_every_user_setting_wins(emulate: bool):
    adapter = GaudiAdapter(emulate=emulate)
    assert DEEPSPEED_GRADIENT_CLIPPING == 1.0
    assert adapter.strategy_defaults("ddp") == {} and adapter.strategy_defaults("fsdp2") == {}
    assert resolved(DeepSpeedPlugin(), adapter)["gradient_clipping"] == 1.0
    assert (
        resolved(DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "gradient_clipping": "auto"}), adapter)[
            "gradient_clipping"
        ]
        == 1.0
    )
    assert (
        resolved(DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "gradient_clipping": 0.0}), adapter)[
            "gradient_clipping"
        ]
        == 0.0
    )
    assert resolved(DeepSpeedPlugin(gradient_clipping=0.25), adapter)["gradient_clipping"] == 0.25


WORKER = """
import copy, os
import torch, torch.nn.functional as F
from torch import nn
from accel import Accelerator, set_seed
from accel.state import AcceleratorState, GradientState
from accel.strategies.deepspeed import DeepSpeedPlugin
from deepspeed.accelerator import get_accelerator

RANKS, PER_RANK, STEPS = 2, 4, 3

def batch(step):
    # Targets far from the initial outputs: the global gradient norm is well above 1.
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(RANKS * PER_RANK, 5, generator=g), 20 * torch.randn(RANKS * PER_RANK, 2, generator=g)

def reference(model, clip):
    # One process: each rank's mean-loss gradient, averaged over ranks, clipped, one SGD step.
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    norms = []
    for step in range(STEPS):
        x, y = batch(step)
        grads = []
        for r in range(RANKS):
            model.zero_grad()
            s = slice(r * PER_RANK, (r + 1) * PER_RANK)
            F.mse_loss(model(x[s]), y[s]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(gs) / RANKS
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else float("inf"))))
        opt.step()
    return norms

def run(name, plugin, expected_clip):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(0)
    acc = Accelerator(deepspeed_plugin=plugin)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))
    ref = copy.deepcopy(model)
    loader = torch.utils.data.DataLoader(list(range(RANKS * PER_RANK)), batch_size=PER_RANK)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05), loader)
    # The adapter's device (cpu under emulation, hpu on hardware) is DeepSpeed's accelerator.
    assert acc.adapter.name == "gaudi", acc.adapter.name
    assert get_accelerator().device_name() == acc.adapter.device_type == acc.device.type, get_accelerator()
    assert os.environ["DS_ACCELERATOR"] == acc.adapter.device_type
    assert torch.distributed.get_backend() == acc.adapter.backend
    assert float(model.gradient_clipping()) == expected_clip, (name, model.gradient_clipping())
    ref_norms = reference(ref, expected_clip)
    for step in range(STEPS):
        x, y = batch(step)
        s = slice(acc.process_index * PER_RANK, (acc.process_index + 1) * PER_RANK)
        acc.backward(F.mse_loss(model(x[s]), y[s]))
        norm = acc.clip_grad_norm_(model.parameters(), expected_clip)
        torch.testing.assert_close(float(norm), ref_norms[step], rtol=1e-5, atol=1e-5)
        opt.step()
        opt.zero_grad()
    state = acc.get_state_dict(model)
    worst = max((state[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    assert worst <= 1e-5, (name, worst)
    acc.print(f"RESULT {name} clip={expected_clip} norms={[round(n, 3) for n in ref_norms]} max|diff|={worst:.3g}")
    return {k: v.clone() for k, v in state.items()}

clipped = run("default", DeepSpeedPlugin(zero_stage=2), 1.0)
unclipped = run("plugin-0", DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.0), 0.0)
run("config-0.25", DeepSpeedPlugin(zero_stage=2, hf_ds_config={"zero_optimization": {}, "gradient_clipping": 0.25}), 0.25)
# The default really changed the training: with clipping off the weights end elsewhere.
gap = max((clipped[k] - unclipped[k]).abs().max().item() for k in clipped)
assert gap > 1e-2, gap
print(f"DONE rank={os.environ['RANK']} clipped-vs-unclipped={gap:.3g}")
"""


def test_zero2_on_emulated_gaudi_clips_at_1_by_default(launch, write_script):
    proc = launch(write_script(WORKER), timeout=900)
    out = proc.stdout
    for name in ("default clip=1.0", "plugin-0 clip=0.0", "config-0.25 clip=0.25"):
        assert f"RESULT {name} " in out, out
    assert "DONE rank=0" in out and "DONE rank=1" in out, out
    print("\n".join(line for line in out.splitlines() if line.startswith(("RESULT", "DONE"))))  # shown with -s


@pytest.mark.parametrize("how", ["mixed_precision_fp8", "fp8_option_with_bf16"])
def test_fp8_layers_fused_adamw_and_the_hpu_switch_reach_the_engine(monkeypatch, how):
    """One process: `mixed_precision="fp8"` (as optimum-habana: Accelerate's bf16 engine, the model converted
    before `deepspeed.initialize`) or `--fp8` with bf16 converts the Linears before the engine is built, the
    engine runs in bf16 and trains Habana's FusedAdamW (emulated) with the forward in fp8, and
    DEEPSPEED_USE_HPU is set for Habana's fork."""
    import torch
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin
    from accel_gaudi import hpu_emulated
    from torch import nn

    monkeypatch.delenv("DEEPSPEED_USE_HPU", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    precision = {"mixed_precision": "fp8"} if how == "mixed_precision_fp8" else {"mixed_precision": "bf16"}
    options = {} if how == "mixed_precision_fp8" else {"fp8": True}
    acc = Accelerator(
        **precision,
        adapter="gaudi",
        emulate=True,
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=1),
        adapter_options=options,
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    plain = copy.deepcopy(model).to(torch.bfloat16)
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=4)
    engine, opt, _ = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), loader)
    assert os.environ["DEEPSPEED_USE_HPU"] == "true"
    assert engine.bfloat16_enabled() and not engine.fp16_enabled()
    inner = engine.module
    assert hpu_emulated.is_fp8_linear(inner[0]) and hpu_emulated.is_fp8_linear(inner[2])
    assert {p.dtype for p in engine.parameters()} == {torch.bfloat16}
    assert isinstance(engine.optimizer.optimizer, hpu_emulated.EmulatedFusedAdamW), type(engine.optimizer)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        # The forward quantises to fp8: near the plain bf16 model's output, not equal to it.
        fp8_out, bf16_out = engine(x).float(), plain(x).float()
    assert not torch.equal(fp8_out, bf16_out) and torch.allclose(fp8_out, bf16_out, atol=0.1, rtol=0.1)
    before = [p.detach().float().clone() for p in engine.parameters()]
    acc.backward(engine(x).float().square().mean())
    opt.step()
    assert hpu_emulated.calls["fused_adamw_step"] >= 1
    assert any(not torch.equal(a, p.detach().float()) for a, p in zip(before, engine.parameters()))


def train_beside_reference(acc, engine, opt, ref, ref_opt, *, tol: float) -> None:
    """Three steps of the engine and of a plain-torch reference on the same batch; then the weights agree."""
    import torch
    import torch.nn.functional as F

    x, y = torch.randn(4, 4, generator=torch.Generator().manual_seed(1)), torch.randn(4, 2)
    for _ in range(3):
        acc.backward(F.mse_loss(engine(x), y))
        opt.step()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    state = acc.get_state_dict(engine)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k], v, atol=tol, rtol=tol, msg=k)


def test_optimizer_offload_maps_adamw_to_cpu_adam_in_eager_mode_and_refuses_lazy_mode(monkeypatch):
    """One process, as Accelerate on HPU: offload + a torch AdamW trains DeepSpeed's CPU Adam in
    AdamW mode (not Habana's FusedAdamW) with the same update as torch's AdamW; lazy mode is refused."""
    import torch
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from torch import nn

    def build(lazy: str):
        monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy)
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        plugin = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu", gradient_clipping=0.0)
        return Accelerator(adapter="gaudi", emulate=True, deepspeed_plugin=plugin)

    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ref = nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=4)
    acc = build("1")
    with pytest.raises(ValueError, match=r"^You can't use an Offload Optimizer with HPU in Lazy Mode"):
        acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5), loader)
    acc = build("0")
    engine, opt, _ = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5), loader)
    assert type(engine.basic_optimizer) is DeepSpeedCPUAdam and engine.basic_optimizer.adam_w_mode is True
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.1, weight_decay=0.5)
    train_beside_reference(acc, engine, opt, ref, ref_opt, tol=1e-6)


@pytest.mark.parametrize("enabled", [True, False])
def test_compiled_autograd_enabled_compiles_the_engines_backward(enabled: bool, monkeypatch: pytest.MonkeyPatch):
    """One process: with a dynamo backend the engine is compiled after `deepspeed.initialize`
    (`engine.compile`), and `compiled_autograd_enabled` (optimum-habana's `GaudiAccelerator` argument)
    turns on compiled autograd for its backward: the backward graph is captured, and training still
    equals plain SGD. Off, the backward runs eagerly."""
    import torch
    from accel import Accelerator
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin
    from torch import nn
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")  # compilation runs in eager mode only
    acc = Accelerator(
        adapter="gaudi",
        emulate=True,
        dynamo_backend="aot_eager",
        deepspeed_plugin=DeepSpeedPlugin(zero_stage=1, gradient_clipping=0.0),
        adapter_options={"compiled_autograd_enabled": enabled},
    )
    assert acc.adapter.compiled_autograd() is enabled
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ref = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    ref.load_state_dict(model.state_dict())
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=4)
    engine, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
    assert engine.is_compiled and engine._is_compiled_autograd_enabled is enabled
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    train_beside_reference(acc, engine, opt, ref, ref_opt, tol=1e-5)
    captured = counters["compiled_autograd"]["captures"]
    assert (captured > 0) is enabled, dict(counters["compiled_autograd"])
