"""Two gloo ranks through `accel launch --adapter cuda --emulate --gpu_ids 3,5` on an emulated machine of two RTX
4090s on an old driver: MULTI_GPU, the launcher's CUDA_VISIBLE_DEVICES and NCCL variables, set_device per local rank, DDP
against a one-process reference, the fp16/bf16/PowerSGD comm hooks, FSDP2 with CPU offload
(pinning off), compile after DDP, an fp16 overflow on one rank, and the distributed-only
device-map errors, fp8 (torchao), fp16 and regional compilation under FSDP2, FSDP2's ignored_modules. One launch runs every scenario (a launch costs ~10 s here); each test
checks one of them."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import EMULATED

WORKER = r"""
import copy, json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from accel import (Accelerator, DDPCommunicationHookType as Hook, DistributedDataParallelKwargs, FSDPConfig,
                   GradScalerKwargs, TorchDynamoPlugin)
from accel.state import AcceleratorState, GradientState
from accel_cuda import cuda_emulated

out = {}
STEPS = 4

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(6, 32)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

def fresh(**kwargs):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(adapter="cuda", emulate=True, **kwargs)

def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)

def train(acc, model=None):
    model = model or Net()
    # SGD, not Adam: Adam is blind to a wrong gradient scale (e.g. a missing 1/world).
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    r = acc.process_index
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss = nn.functional.mse_loss(model(x[4 * r: 4 * r + 4]), y[4 * r: 4 * r + 4])
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses

def weights(acc, model):
    return {k: v.tolist() for k, v in acc.get_state_dict(model).items()}

# One process, full batches: what every data-parallel run must reproduce.
ref = Net()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(STEPS):
    x, y = batch(step)
    nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    ref_opt.zero_grad()
out["reference"] = {k: v.tolist() for k, v in ref.state_dict().items()}

acc = fresh()
rank = acc.process_index
out["distributed_type"] = str(acc.distributed_type)
out["launch_env"] = {v: os.environ.get(v) for v in ("CUDA_VISIBLE_DEVICES", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")}
out["set_device"] = list(cuda_emulated.current_device)
out["group_started_at_set_device"] = list(cuda_emulated.group_started_at_set_device)
model, _ = train(acc)
out["ddp_type"] = type(model).__name__
out["ddp"] = weights(acc, model)

hooks = [("fp16", Hook.FP16, {})]
# PowerSGD's hook calls torch.cuda.synchronize(<its tensors' device>) whenever CUDA is available,
# which fails for CPU tensors: emulated PowerSGD runs only where torch sees no GPU.
out["powersgd_runs"] = not torch.cuda.is_available()
if out["powersgd_runs"]:
    opts = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2, "min_compression_rate": 1}
    hooks.append(("powersgd", Hook.POWER_SGD, opts))
for name, hook, opts in hooks:
    acc = fresh(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=hook, comm_state_option=opts)])
    model, losses = train(acc)
    out[name + "_hook"] = model._get_ddp_logging_data().get("comm_hook", "")
    out[name] = weights(acc, model)
    out[name + "_losses"] = losses

# torch accepts the bf16 hook only where its build has CUDA and NCCL 2.10+ (or XPU); on a
# CPU-only torch emulation records torch's refusal instead.
acc = fresh(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=Hook.BF16)])
try:
    model, _ = train(acc)
    out["bf16_error"] = ""
    out["bf16_hook"] = model._get_ddp_logging_data().get("comm_hook", "")
    out["bf16"] = weights(acc, model)
except TypeError as exc:
    out["bf16_error"] = str(exc)

acc = fresh(fsdp_plugin=FSDPConfig(cpu_offload=True))
model, _ = train(acc)
out["fsdp_local_rows"] = model.embed.weight.to_local().shape[0]
out["fsdp_param_device"] = model.embed.weight.device.type
out["fsdp"] = weights(acc, model)

# FSDP1 (Accelerate's default fsdp_version) on the adapter's device: torch's FullyShardedDataParallel.
acc = fresh(fsdp_plugin=FSDPConfig(fsdp_version=1, backward_prefetch="BACKWARD_PRE", use_orig_params=False))
model, _ = train(acc)
out["fsdp1_wrapper"] = [type(model).__name__, model.sharding_strategy.name, model.backward_prefetch.name]
out["fsdp1"] = weights(acc, model)

# Context parallelism, as Accelerate runs it (ParallelismConfig(cp_size=2) on FSDP2, maybe_context_parallel):
# each rank holds half of every sequence and attends over the whole through torch's ring (the emulated GPU's
# flash kernel is the host's, registered in the ring by cuda_emulated); trains as one process on full sequences.
from accel import ParallelismConfig

class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.proj = nn.Linear(8, 24), nn.Linear(8, 1)

    def forward(self, x):
        b, length, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(b, length, 3, 2, 4).unbind(2))
        h = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(h.transpose(1, 2).reshape(b, length, 8))

g = torch.Generator().manual_seed(7)
xs, ys = torch.randn(2, 8, 8, generator=g), torch.randn(2, 8, 1, generator=g)
ref = Attention()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for _ in range(2):
    nn.functional.mse_loss(ref(xs), ys).backward()
    ref_opt.step()
    ref_opt.zero_grad()
acc = fresh(parallelism_config=ParallelismConfig(cp_size=2))
model = Attention()
model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
cuda_emulated.calls.clear()
for _ in range(2):
    x, y = xs.clone(), ys.clone()
    with acc.maybe_context_parallel(buffers=[x, y], buffer_seq_dims=[1, 1], no_restore_buffers={x, y}):
        out["cp_local_length"] = x.shape[1]
        acc.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    opt.zero_grad()
out["cp_ring_calls"] = [cuda_emulated.calls["ring_attention"], cuda_emulated.calls["ring_attention_backward"]]
cp_state = acc.get_state_dict(model)
if acc.is_main_process:
    out["cp_weights_diff"] = max((cp_state[k] - v).abs().max().item() for k, v in ref.state_dict().items())

# Regional compilation under FSDP2, Accelerate's way: each block compiled in place (the module objects and the
# hooks fully_shard put on them stay), dynamo capturing scalar outputs.
acc = fresh(fsdp_plugin=FSDPConfig(), dynamo_plugin=TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True))
model, _ = train(acc)
out["fsdp_regional"] = {
    "same_object": type(model).__name__,
    "compiled": [m._compiled_call_impl is not None for m in (model.embed, *model.blocks, model.head)],
    "block_sharded": type(model.blocks[0][0].weight).__name__,
    "capture_scalar_outputs": torch._dynamo.config.capture_scalar_outputs,
}
out["fsdp_regional_weights"] = weights(acc, model)

# fp8 (torchao) under FSDP2: every Linear converted before sharding, the weights' fp8 scales precomputed
# after each optimizer step (enable_fsdp_float8_all_gather, on by default as in Accelerate).
from accel.utils import AORecipeKwargs
acc = fresh(mixed_precision="fp8", fsdp_plugin=FSDPConfig(),
            kwargs_handlers=[AORecipeKwargs(module_filter_func=lambda m, fqn: True)])
model, _ = train(acc)
out["fp8_fsdp_layers"] = sum(cuda_emulated.is_ao_linear(m) for m in model.modules())
out["fp8_fsdp_local_rows"] = model.embed.weight.to_local().shape[0]
out["fp8_fsdp_precomputes"] = sum(cuda_emulated.fsdp_scale_precomputes.values())
out["fp8_fsdp"] = weights(acc, model)

# fp16 under FSDP2, as Accelerate runs it (a GradScaler on the device type over DTensor gradients)...
acc = fresh(mixed_precision="fp16", fsdp_plugin=FSDPConfig(), kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
model, _ = train(acc)
out["fp16_fsdp_scaler"] = type(acc.scaler).__name__
out["fp16_fsdp"] = weights(acc, model)
# ...whose inf check spans the shards: an inf in rank 1's shard alone skips the step on both ranks.
opt = acc._optimizers[0]
x, y = batch(0)
acc.backward(nn.functional.mse_loss(model(x[4 * rank: 4 * rank + 4]), y[4 * rank: 4 * rank + 4]))
if rank == 1:
    model.embed.weight.grad.to_local()[0, 0] = float("inf")
opt.step(); opt.zero_grad()
out["fp16_fsdp_skipped"] = [acc.optimizer_step_was_skipped, acc.scaler.get_scale()]
out["fp16_fsdp_after_skip"] = weights(acc, model)
# The same fp16 training in one process on the full batch: autocast to fp16, fp32 master weights.
ref16 = Net()
ref16_opt = torch.optim.SGD(ref16.parameters(), lr=0.1)
for step in range(STEPS):
    x, y = batch(step)
    with torch.autocast("cpu", dtype=torch.float16):
        pred = ref16(x)
    nn.functional.mse_loss(pred.float(), y).backward()
    ref16_opt.step()
    ref16_opt.zero_grad()
out["fp16_reference"] = {k: v.tolist() for k, v in ref16.state_dict().items()}

# FSDP2 ignored_modules (a regex of module names, as in Accelerate): those parameters stay whole tensors.
acc = fresh(fsdp_plugin=FSDPConfig(ignored_modules="head"))
model, _ = train(acc)
out["ignored_types"] = {n: type(p).__name__ for n, p in model.named_parameters() if n.split(".")[0] in ("embed", "head")}

acc = fresh(dynamo_plugin=TorchDynamoPlugin(backend="aot_eager"))
model, _ = train(acc)
out["compiled_type"] = type(model).__name__
out["compiled_inner"] = type(getattr(model, "_orig_mod", model)).__name__
out["compiled"] = weights(acc, model)

# fp16: an overflow on rank 1 alone reaches rank 0 through the all-reduce; both skip the step.
acc = fresh(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
model, opt, sched = acc.prepare(model, opt, sched)
x, y = batch(0)
loss = nn.functional.mse_loss(model(x), y)
if rank == 1:
    loss = loss * float("inf")
acc.backward(loss)
opt.step(); sched.step(); opt.zero_grad()
out["fp16_skipped"] = acc.optimizer_step_was_skipped
out["fp16_lr"] = sched.get_last_lr()[0]
out["fp16_scale"] = acc.scaler.get_scale()

def error_of(fn):
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return ""

acc = fresh()
quantized = Net()
quantized.is_loaded_in_8bit = True
quantized.hf_device_map = {"embed": 0, "head": 1}
out["quantized_multi_device"] = error_of(lambda: acc.prepare(quantized))
auto = Net()
auto.hf_device_map = {"embed": 0, "head": 1}
out["device_map_auto"] = error_of(lambda: acc.prepare(auto))

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("cuda_dist")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    # As `accelerate launch --gpu_ids 3,5` on a machine of two RTX 4090s on an old driver (emulated).
    machine = {"ACCEL_CUDA_EMULATED_GPUS": "NVIDIA GeForce RTX 4090,NVIDIA GeForce RTX 4090"}
    machine["ACCEL_CUDA_EMULATED_DRIVER"] = "535.104.05"
    launch(script, str(tmp), launch_args=(*EMULATED, "--gpu_ids", "3,5"), env=machine)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def weights(result: dict, key: str) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v) for k, v in result[key].items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_a_multi_process_cuda_run_is_multi_gpu(results):
    assert [r["distributed_type"] for r in results] == ["DistributedType.MULTI_GPU"] * 2


def test_the_launcher_makes_gpu_ids_visible_and_turns_p2p_ib_off_on_rtx_4000_gpus(results):
    # The workers started (the P2P/IB check passed on the variables the launcher set) on GPUs 3 and 5 only.
    expected = {"CUDA_VISIBLE_DEVICES": "3,5", "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    assert [r["launch_env"] for r in results] == [expected] * 2


def test_each_rank_makes_its_own_gpu_current_before_the_group(results):
    assert [r["set_device"] for r in results] == [[0], [1]]
    assert [r["group_started_at_set_device"] for r in results] == [[False], [False]]


def test_ddp_matches_one_process_on_the_full_batch(results):
    r0 = results[0]
    assert r0["ddp_type"] == "DistributedDataParallel"
    assert max_diff(weights(r0, "ddp"), weights(r0, "reference")) < 1e-6


def test_fp16_compression_hook_is_registered_and_close(results):
    r0 = results[0]
    assert "fp16_compress_hook" in r0["fp16_hook"]
    diff = max_diff(weights(r0, "fp16"), weights(r0, "ddp"))
    assert 0.0 < diff < 5e-3  # fp16-compressed gradients: close, not identical


def test_bf16_compression_hook_reaches_ddp(results):
    r0 = results[0]
    if r0["bf16_error"]:
        # The hook reached DDP; a CPU-only torch build refuses it (it needs CUDA and NCCL 2.10+).
        assert torch.version.cuda is None
        assert "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+" in r0["bf16_error"]
        return
    assert "bf16_compress_hook" in r0["bf16_hook"]
    assert 0.0 < max_diff(weights(r0, "bf16"), weights(r0, "ddp")) < 3e-2  # bf16 gradients: close, not identical


def test_powersgd_compresses_after_its_warm_up(results):
    r0 = results[0]
    if not r0["powersgd_runs"]:
        pytest.skip("torch's PowerSGD hook synchronizes a CUDA device for CPU tensors when a GPU is visible")
    assert "powerSGD_hook" in r0["powersgd_hook"]
    # Rank-1 approximations of the 32x32 gradients from step 2 on: the weights leave DDP's...
    assert max_diff(weights(r0, "powersgd"), weights(r0, "ddp")) > 1e-4
    # ...training still lowers the loss on every rank.
    assert all(r["powersgd_losses"][-1] < r["powersgd_losses"][0] for r in results)


def test_fsdp2_with_cpu_offload_runs_unpinned_and_matches_ddp(results):
    r0, r1 = results
    assert r0["fsdp_local_rows"] == 16  # embed's 32 rows, half on each rank
    assert r0["fsdp_param_device"] == "cpu"
    assert max_diff(weights(r0, "fsdp"), weights(r0, "ddp")) < 1e-5
    assert r1["fsdp"] == {}  # the full state dict is gathered on the main process


def test_fsdp1_wraps_in_fully_sharded_data_parallel_and_matches_ddp(results):
    for r in results:
        assert r["fsdp1_wrapper"] == ["FullyShardedDataParallel", "FULL_SHARD", "BACKWARD_PRE"]
        assert max_diff(weights(r, "fsdp1"), weights(results[0], "ddp")) < 1e-5


def test_context_parallelism_splits_sequences_through_the_ring_and_trains_as_one_process(results):
    for r in results:
        assert r["cp_local_length"] == 4  # half of each 8-token sequence on each rank
        assert r["cp_ring_calls"] == [2, 2]  # forward and backward of 2 steps through the ring
    assert results[0]["cp_weights_diff"] < 1e-5


def test_regional_compilation_under_fsdp2_compiles_blocks_in_place_and_trains_as_eager(results):
    r0 = results[0]
    assert r0["fsdp_regional"] == {
        "same_object": "FSDPNet",  # fully_shard's class: the model object itself, not a copy or a wrapper
        "compiled": [True] * 4,  # embed, both blocks, head: each its own region
        "block_sharded": "DTensor",
        "capture_scalar_outputs": True,
    }
    assert max_diff(weights(r0, "fsdp_regional_weights"), weights(r0, "fsdp")) < 1e-6


def test_fp8_under_fsdp2_shards_converted_layers_and_precomputes_scales_each_step(results):
    for r in results:
        assert r["fp8_fsdp_layers"] == 4
        assert r["fp8_fsdp_local_rows"] == 16  # 32 rows over 2 ranks
        assert r["fp8_fsdp_precomputes"] == 4  # one per optimizer step
    diff = max_diff(weights(results[0], "fp8_fsdp"), weights(results[0], "reference"))
    assert 0 < diff < 0.05, diff  # fp8-rounded, close to the one-process fp32 run


def test_fp16_under_fsdp2_matches_one_process_fp16_and_an_inf_in_one_shard_skips_everywhere(results):
    r0 = results[0]
    assert r0["fp16_fsdp_scaler"] == "GradScaler"  # Accelerate's get_fsdp2_grad_scaler: torch.amp.GradScaler
    fp16, reference = weights(r0, "fp16_fsdp"), weights(r0, "fp16_reference")
    # Measured: 2.0e-5 from the one-process fp16 run, 5.8e-5 from FSDP2's fp32 weights (it did run in fp16).
    to_fp16, to_fp32 = max_diff(fp16, reference), max_diff(fp16, weights(r0, "fsdp"))
    assert to_fp16 < 4e-5 and to_fp16 < 0.5 * to_fp32, (to_fp16, to_fp32)
    for r in results:
        assert r["fp16_fsdp_skipped"] == [True, 512.0]  # init_scale 1024, backed off once
    assert max_diff(weights(r0, "fp16_fsdp_after_skip"), fp16) == 0.0


def test_fsdp2_ignored_modules_stay_unsharded(results):
    expected = {
        "embed.weight": "DTensor",
        "embed.bias": "DTensor",
        "head.weight": "Parameter",
        "head.bias": "Parameter",
    }
    assert [r["ignored_types"] for r in results] == [expected] * 2


def test_compile_comes_last_around_ddp_and_trains_identically(results):
    r0 = results[0]
    assert r0["compiled_type"] == "OptimizedModule" and r0["compiled_inner"] == "DistributedDataParallel"
    assert max_diff(weights(r0, "compiled"), weights(r0, "ddp")) < 1e-6


def test_fp16_overflow_on_one_rank_skips_the_step_everywhere(results):
    for r in results:
        assert r["fp16_skipped"] is True
        assert r["fp16_lr"] == 0.1  # the scheduler did not move
        assert r["fp16_scale"] == 512.0


def test_device_map_errors_in_distributed_mode(results):
    for r in results:
        assert "8-bit or 4-bit precision on multiple devices in any distributed mode" in r["quantized_multi_device"]
        assert "loaded with `device_map='auto'` in any distributed mode" in r["device_map_auto"]
