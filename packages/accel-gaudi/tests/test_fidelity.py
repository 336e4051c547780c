"""Behaviours matched to optimum-habana's `GaudiAccelerator` (issue 20), emulated: fp8 conversion
(LoRA base layers only, fp8 fused SDPA, PT_HPU_FP8_MINIMIZE_MEMORY, the recipe's defaults,
recompute under gradient checkpointing, Gaudi1's fp8 option refused), fast_ddp's asynchronous all-reduce,
Habana's fused AdamW / clip norm, and DeepSpeed's HPU switch."""

from __future__ import annotations

import functools
import os

import pytest
import torch
import torch.distributed as dist
from accel import Accelerator
from accel_gaudi import GaudiAdapter, GaudiFP8RecipeKwargs, hpu_emulated
from accel_gaudi.fast_ddp import FastDDP
from torch import nn
from torch.utils.checkpoint import checkpoint


def fp8_round_trip(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-tensor quantisation with the current amax, written independently of the emulation."""
    fmax = torch.finfo(dtype).max
    scale = fmax / t.abs().max()
    return (t * scale).clamp(-fmax, fmax).to(dtype).to(torch.float32) / scale


# ---- fp8 recipe and conversion --------------------------------------------------------------
def test_recipe_defaults_to_no_amax_reduction_as_gaudis():
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8")
    model = acc.prepare(nn.Sequential(nn.Linear(4, 4)))
    assert GaudiFP8RecipeKwargs().reduce_amax is False
    assert model._accel_fp8_recipe.reduce_amax is False
    assert hpu_emulated.make_fp8_recipe().reduce_amax is False


class LoraLinear(nn.Module):
    """peft's `lora.Linear` shape: a frozen base layer plus the small A/B adapters."""

    def __init__(self, base: nn.Linear, r: int = 2) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base.out_features, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))


def test_lora_layers_convert_only_their_base_layer():
    torch.manual_seed(0)
    model = nn.Sequential(LoraLinear(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 2))
    params = list(model.parameters())
    model = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(model)
    lora = model[0]
    assert hpu_emulated.is_fp8_linear(lora.base_layer) and hpu_emulated.is_fp8_linear(model[2])
    assert type(lora.lora_A["default"]) is nn.Linear and type(lora.lora_B["default"]) is nn.Linear
    assert all(a is b for a, b in zip(model.parameters(), params))


class ModuleFusedSDPA(nn.Module):
    """optimum-habana's fused-SDPA module, as far as its conversion reads it."""

    def __init__(self, flash_attention_fp8: bool) -> None:
        super().__init__()
        self.flash_attention_fp8 = flash_attention_fp8
        self.scale, self.attention_dropout, self.enable_recompute = 0.5, 0.0, False

    def forward(self, q, k, v, attn_mask, dropout_p, is_causal, scale, softmax_mode, *rest):  # type: ignore[no-untyped-def]
        return nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale
        )


class Attention(nn.Module):
    def __init__(self, fp8: bool) -> None:
        super().__init__()
        self.fsdpa = ModuleFusedSDPA(fp8)

    def forward(self, q, k, v):  # type: ignore[no-untyped-def]
        return self.fsdpa(q, k, v, None, 0.0, True, 0.5, "None", False, None, "left")


def test_fp8_fused_sdpa_becomes_the_vendors_fp8_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    model = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(Attention(fp8=True))
    assert isinstance(model.fsdpa._hpu_kernel_fsdpa, hpu_emulated.FusedAttention)
    fwd = torch.float8_e4m3fn
    expected = nn.functional.scaled_dot_product_attention(
        fp8_round_trip(q, fwd), fp8_round_trip(k, fwd), fp8_round_trip(v, fwd), is_causal=True, scale=0.5
    )
    out = model(q, k, v)
    assert torch.allclose(out, expected, atol=1e-6)
    assert (out - nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)).abs().max() > 1e-4
    # Without flash_attention_fp8 the module stays as it is.
    kept = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(Attention(fp8=False))
    assert type(kept.fsdpa) is ModuleFusedSDPA


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("0", False), (None, False)])
def test_pt_hpu_fp8_minimize_memory_reaches_the_vendor_layers(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("PT_HPU_FP8_MINIMIZE_MEMORY", value)
    else:
        monkeypatch.delenv("PT_HPU_FP8_MINIMIZE_MEMORY", raising=False)
    model = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(nn.Sequential(nn.Linear(2, 2)))
    assert model[0].minimize_memory is expected


def test_pt_hpu_fp8_minimize_memory_rejects_other_words(monkeypatch):
    monkeypatch.setenv("PT_HPU_FP8_MINIMIZE_MEMORY", "maybe")
    with pytest.raises(ValueError, match=r"PT_HPU_FP8_MINIMIZE_MEMORY must be true or false, got 'maybe'"):
        Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(nn.Sequential(nn.Linear(2, 2)))


class Checkpointed(nn.Module):
    """A `transformers`-style model: with `gradient_checkpointing` on, blocks run through
    `self._gradient_checkpointing_func(block, x)`."""

    def __init__(self, gradient_checkpointing: bool) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16))
        self.head = nn.Linear(16, 1)
        self.gradient_checkpointing = gradient_checkpointing
        self._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._gradient_checkpointing_func(self.block, x) if self.gradient_checkpointing else self.block(x)
        return self.head(h)


def _fp8_grads(gradient_checkpointing: bool) -> list[torch.Tensor]:
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    model = Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp8").prepare(
        Checkpointed(gradient_checkpointing)
    )
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_recompute_under_gradient_checkpointing_runs_in_fp8_like_the_forward():
    plain, recomputed = _fp8_grads(False), _fp8_grads(True)
    # Identical fp8 numerics whether the block's activations were kept or recomputed.
    for a, b in zip(plain, recomputed):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_gaudi1_refuses_the_fp8_option_with_a_clear_error(monkeypatch):
    # `mixed_precision="fp8"` falls back to bf16 there (test_fp8_accelerate_handlers); the adapter's own
    # fp8 option asks for fp8 layers explicitly and is refused.
    monkeypatch.setenv("ACCEL_GAUDI_EMULATED_DEVICE", "GAUDI")
    monkeypatch.setenv("ACCEL_GAUDI_FP8", "1")
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="bf16")
    with pytest.raises(ValueError, match=r"fp8 needs Gaudi2 or later; this device is GAUDI \(Gaudi1\)"):
        acc.prepare(nn.Sequential(nn.Linear(2, 2)))
    monkeypatch.setenv("ACCEL_GAUDI_EMULATED_DEVICE", "GAUDI3")
    GaudiAdapter(emulate=True).check_fp8_supported()  # Gaudi2 and later: no error


# ---- fast_ddp -------------------------------------------------------------------------------
@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fast_ddp_all_reduce_is_asynchronous_and_waited_before_unpacking(one_rank_group, monkeypatch):
    model = nn.Linear(3, 2)
    reducer = FastDDP(torch.float32)
    reducer.register(model)
    model(torch.ones(1, 3)).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    events = []
    real = dist.all_reduce

    def spy(tensor, *args, **kwargs):
        events.append(("all_reduce", kwargs.get("async_op", False)))
        work = real(tensor, *args, **kwargs)

        class Work:
            def wait(self):
                events.append(("wait", None))
                return work.wait()

        return Work()

    monkeypatch.setattr(dist, "all_reduce", spy)
    reducer.all_reduce_gradients()
    assert events == [("all_reduce", True), ("wait", None)]
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected))


# ---- Habana's fused optimizer and clip norm ---------------------------------------------------
def _train_adamw(fused: bool) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, betas=(0.8, 0.9), weight_decay=0.1)
    acc = Accelerator(adapter="gaudi", emulate=True, adapter_options={"fused_optimizers": fused})
    model, opt = acc.prepare(model, opt)
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(5):
        acc.backward(model(x).square().mean())
        acc.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        opt.zero_grad()
    return acc, model, opt


def test_adamw_becomes_habanas_fused_adamw_with_the_same_updates():
    _, fused_model, fused_opt = _train_adamw(True)
    assert type(fused_opt.optimizer) is hpu_emulated.EmulatedFusedAdamW
    group = fused_opt.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (0.05, (0.8, 0.9), 0.1)
    assert hpu_emulated.calls["fused_adamw_step"] == 5 and hpu_emulated.calls["fused_clip_norm"] == 5
    hpu_emulated.calls.clear()
    _, torch_model, torch_opt = _train_adamw(False)
    assert type(torch_opt.optimizer) is torch.optim.AdamW and not hpu_emulated.calls["fused_clip_norm"]
    for a, b in zip(fused_model.parameters(), torch_model.parameters()):
        assert torch.allclose(a, b, atol=1e-7)


def test_adamw_with_options_the_fused_one_lacks_is_kept():
    model = nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), amsgrad=True)
    _, opt = Accelerator(adapter="gaudi", emulate=True).prepare(model, opt)
    assert type(opt.optimizer) is torch.optim.AdamW


# ---- DeepSpeed ------------------------------------------------------------------------------
def test_deepspeed_defaults_switch_habanas_deepspeed_to_hpu(monkeypatch):
    monkeypatch.delenv("DEEPSPEED_USE_HPU", raising=False)
    adapter = GaudiAdapter(emulate=True)
    assert adapter.strategy_defaults("ddp") == {} and "DEEPSPEED_USE_HPU" not in os.environ
    assert adapter.strategy_defaults("deepspeed")["gradient_clipping"] == 1.0
    assert os.environ["DEEPSPEED_USE_HPU"] == "true"
    monkeypatch.setenv("DEEPSPEED_USE_HPU", "false")  # the user's choice stays
    adapter.strategy_defaults("deepspeed")
    assert os.environ["DEEPSPEED_USE_HPU"] == "false"


# ---- data loaders -------------------------------------------------------------------------------
@pytest.fixture
def world_of(monkeypatch):
    """An Accelerator in a process group of `n` ranks, this process rank 0 (torch's single-process fake
    backend: nothing else runs, and no collective is needed to prepare a loader)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def make(n: int) -> Accelerator:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
        return Accelerator(adapter="gaudi", emulate=True)

    yield make
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("how", ["prepare", "prepare_data_loader"])
@pytest.mark.parametrize(("world", "workers", "spawned"), [(16, 2, True), (8, 2, False), (16, 0, False)])
def test_large_worlds_give_data_loader_workers_the_spawn_context(world_of, how, world, workers, spawned):
    acc = world_of(world)
    assert acc.num_processes == world
    loader = torch.utils.data.DataLoader(list(range(64)), batch_size=2, num_workers=workers)
    prepared = getattr(acc, how)(loader)
    context = prepared.multiprocessing_context
    assert (context is not None and context.get_start_method() == "spawn") is spawned
    assert spawned or context is None
    assert loader.multiprocessing_context is None  # the user's loader is not changed


def test_a_loaders_own_multiprocessing_context_is_kept(world_of):
    import multiprocessing

    forked = multiprocessing.get_context("forkserver")
    acc = world_of(16)
    loader = torch.utils.data.DataLoader(list(range(64)), num_workers=2, multiprocessing_context=forked)
    assert acc.prepare_data_loader(loader).multiprocessing_context is forked


@pytest.mark.parametrize(
    ("lazy_mode", "offload", "kept"),
    [("1", "cpu", None), ("0", "cpu", True), ("0", None, False), ("1", None, False)],
)
def test_deepspeed_optimizer_offload_keeps_the_torch_optimizer_and_refuses_lazy_mode(
    monkeypatch, lazy_mode, offload, kept
):
    # Accelerate on HPU: offload + a torch optimizer is refused in lazy mode; in eager mode the
    # strategy maps the torch AdamW (kept as AdamW for that) onto DeepSpeed's CPU Adam.
    from accel.prepare.context import PrepareContext
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin, DeepSpeedStrategy

    monkeypatch.setenv("PT_HPU_LAZY_MODE", lazy_mode)
    strategy = DeepSpeedStrategy(DeepSpeedPlugin(zero_stage=2, offload_optimizer_device=offload))
    adapter = GaudiAdapter(emulate=True)
    ctx = PrepareContext(
        device=torch.device("cpu"),
        device_placement=True,
        strategy=strategy,
        adapter=adapter,
        optimizer_on_host=strategy.optimizer_on_host(),
    )
    opt = torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=0.01)
    if kept is None:
        with pytest.raises(ValueError, match=r"^You can't use an Offload Optimizer with HPU in Lazy Mode\. Please set"):
            adapter.prepare_optimizer(opt, ctx)
        return
    prepared = adapter.prepare_optimizer(opt, ctx)
    assert (prepared is opt) is kept
    assert kept or type(prepared) is hpu_emulated.EmulatedFusedAdamW
