"""Two gloo ranks through `accel launch --adapter gaudi --emulate --gpu_ids 2,5`: MULTI_HPU, the launcher's
HABANA_VISIBLE_MODULES, ddp, fast_ddp, FSDP2 with
activation checkpointing, and the distributed-only errors. One launch runs every scenario
(a launch costs ~10 s on this machine); each test checks one of them."""

from __future__ import annotations

import json

import pytest
import torch

WORKER = r"""
import copy, json, os, sys
import torch
import torch.distributed as dist
from torch import nn
from accel import Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs, FSDPConfig
from accel.state import AcceleratorState, GradientState
from accel_gaudi import hpu_emulated

out = {}
STEPS, ACCUM = 3, 2

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

def fresh(strategy_option, **kwargs):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    hpu_emulated.calls.clear()
    os.environ["ACCEL_GAUDI_DISTRIBUTION_STRATEGY"] = strategy_option
    return Accelerator(adapter="gaudi", emulate=True, gradient_accumulation_steps=ACCUM, **kwargs)

def batch(step, rank):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
    return x[4 * rank: 4 * rank + 4], y[4 * rank: 4 * rank + 4]

def train(acc, model, count=False):
    # SGD, not Adam: Adam is blind to a wrong gradient scale (e.g. a missing 1/world).
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    real_all_reduce, counts = dist.all_reduce, []
    def counting(*a, **k):
        counts[-1] += 1
        return real_all_reduce(*a, **k)
    dist.all_reduce = counting
    try:
        for step in range(STEPS * ACCUM):
            if step % ACCUM == 0:
                counts.append(0)
            with acc.accumulate(model):
                x, y = batch(step, acc.process_index)
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
    finally:
        dist.all_reduce = real_all_reduce
    return model, counts

# The launch flag chose fast_ddp: the adapter read it at init.
acc = Accelerator(adapter="gaudi", emulate=True)
out["launch_flag_strategy"] = acc.adapter.config.distribution_strategy
out["distributed_type"] = str(acc.distributed_type)
out["visible_modules"] = os.environ.get("HABANA_VISIBLE_MODULES")
rank = acc.process_index

# Every rank starts from different weights: fast_ddp must broadcast rank 0's.
torch.manual_seed(rank)
start = Net()
torch.manual_seed(0)
reference_start = Net()

acc = fresh("fast_ddp")
fast, counts = train(acc, copy.deepcopy(start))
out["fast_is_plain_module"] = type(fast).__name__ == "Net"
out["fast_all_reduces_per_step"] = counts
out["mark_steps"] = hpu_emulated.calls["mark_step"]
# Packing and unpacking recorded once as HPU graphs and replayed every step: zero_grad() kept the tensors.
out["fast_graphs"] = [hpu_emulated.calls["hpu_graph_capture"], hpu_emulated.calls["hpu_graph_replay"]]
out["fast_grads_kept"] = all(p.grad is not None for p in fast.parameters())
out["fast"] = {k: v.tolist() for k, v in fast.state_dict().items()}

# Accelerator.no_sync under fast_ddp: nothing is reduced inside; the next synchronising
# backward reduces what accumulated, so both ranks end with the same averaged gradient.
real_all_reduce, reduced = dist.all_reduce, [0]
def counting(*a, **k):
    reduced[0] += 1
    return real_all_reduce(*a, **k)
dist.all_reduce = counting
for p in fast.parameters():
    p.grad = None
x, y = batch(0, rank)
with acc.no_sync(fast):
    acc.backward(nn.functional.mse_loss(fast(x), y))
inside = reduced[0]
out["no_sync_local_grad"] = fast.head.bias.grad.tolist()
acc.backward(nn.functional.mse_loss(fast(x), y))
dist.all_reduce = real_all_reduce
out["no_sync_all_reduces"] = [inside, reduced[0]]
out["no_sync_grad"] = fast.head.bias.grad.tolist()
# The gradients were dropped above (set to None): new tensors, so the graphs were recorded again for them.
out["no_sync_graphs"] = [hpu_emulated.calls["hpu_graph_capture"], hpu_emulated.calls["hpu_graph_replay"]]

acc = fresh("ddp", kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.NO, bucket_cap_mb=1)])
ddp, _ = train(acc, copy.deepcopy(reference_start))
out["ddp_type"] = type(ddp).__name__
out["ddp"] = {k: v.tolist() for k, v in acc.unwrap_model(ddp).state_dict().items()}

acc = fresh("ddp", kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)])
hooked, _ = train(acc, copy.deepcopy(reference_start))
out["fp16_hook"] = hooked._get_ddp_logging_data().get("comm_hook", "")
out["fp16"] = {k: v.tolist() for k, v in acc.unwrap_model(hooked).state_dict().items()}

acc = fresh("ddp", fsdp_plugin=FSDPConfig(activation_checkpointing=True))
sharded, _ = train(acc, copy.deepcopy(reference_start))
out["fsdp_local_rows"] = sharded.embed.weight.to_local().shape[0]
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
out["fsdp_checkpoint_wrapped"] = sum(isinstance(m, CheckpointWrapper) for m in sharded.modules())
full = acc.get_state_dict(sharded)
out["fsdp"] = {k: v.tolist() for k, v in full.items()}

# FSDP1 on HPU, as optimum-habana's Trainer runs Accelerate's FSDP plugin (fsdp_version 1 by default).
acc = fresh("ddp", fsdp_plugin=FSDPConfig(fsdp_version=1, sharding_strategy="SHARD_GRAD_OP", use_orig_params=False))
sharded1, _ = train(acc, copy.deepcopy(reference_start))
out["fsdp1_wrapper"] = [type(sharded1).__name__, sharded1.sharding_strategy.name]
out["fsdp1"] = {k: v.tolist() for k, v in acc.get_state_dict(sharded1).items()}

# optimum-habana's context_parallel_size: one sequence-parallel group of both ranks; loaders, gathers and
# reductions over the data-parallel group (each rank alone), so both ranks see every batch.
acc = fresh("ddp", adapter_options={"context_parallel_size": 2})
mpu = acc.mpu
out["cp_mpu"] = [
    mpu.get_sequence_parallel_world_size(), mpu.get_sequence_parallel_rank(), mpu.get_data_parallel_world_size(),
    mpu.get_data_parallel_rank(), mpu.get_sequence_parallel_src_rank(), acc.num_processes,
]
cp_loader = acc.prepare(torch.utils.data.DataLoader(list(range(8)), batch_size=2))
out["cp_batches"] = [b.tolist() for b in cp_loader]
out["cp_gathered"] = acc.gather_for_metrics(torch.tensor([rank])).tolist()
out["cp_reduced"] = acc.reduce(torch.tensor([float(rank + 1)])).tolist()
chunk_sum = torch.tensor([float(rank + 1)])
dist.all_reduce(chunk_sum, group=mpu.get_sequence_parallel_group())
out["cp_sequence_group_sum"] = chunk_sum.item()

def error_of(fn):
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return ""

# Refused when the Accelerator is built (the adapter's `check_strategy`), before anything is prepared.
out["fast_with_fsdp"] = error_of(lambda: fresh("fast_ddp", fsdp_plugin=FSDPConfig()))
out["cp_with_fsdp"] = error_of(lambda: fresh("ddp", fsdp_plugin=FSDPConfig(), adapter_options={"context_parallel_size": 2}))
acc = fresh("ddp")
quantized = Net()
quantized.is_loaded_in_4bit = True
quantized.hf_device_map = {"embed": 0, "head": 1}
out["quantized_multi_device"] = error_of(lambda: acc.prepare(quantized))
auto = Net()
auto.hf_device_map = {"embed": 0, "head": "cpu"}
out["device_map_auto"] = error_of(lambda: acc.prepare(auto))

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("gaudi_dist")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    # As `accelerate launch --gpu_ids 2,5` on a Gaudi machine: the workers see modules 2 and 5 only.
    args = ("--adapter", "gaudi", "--emulate", "--distribution-strategy", "fast_ddp", "--gpu_ids", "2,5")
    launch(script, str(tmp), launch_args=args)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def weights(result: dict, key: str) -> dict[str, torch.Tensor]:
    return {k: torch.tensor(v) for k, v in result[key].items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_launch_flag_selects_fast_ddp(results):
    assert [r["launch_flag_strategy"] for r in results] == ["fast_ddp", "fast_ddp"]


def test_a_multi_process_gaudi_run_is_multi_hpu(results):
    assert [r["distributed_type"] for r in results] == ["DistributedType.MULTI_HPU"] * 2


def test_gpu_ids_become_habana_visible_modules(results):
    assert [r["visible_modules"] for r in results] == ["2,5", "2,5"]


def test_fast_ddp_matches_ddp_after_steps(results):
    r0, r1 = results
    assert r0["fast_is_plain_module"] and r0["ddp_type"] == "DistributedDataParallel"
    # Rank 1 started from other weights: the broadcast at prepare made both ranks rank 0's.
    assert max_diff(weights(r0, "fast"), weights(r1, "fast")) == 0.0
    # Same data, same start: fp32 flat-buffer averaging equals DDP's bucketed averaging.
    assert max_diff(weights(r0, "fast"), weights(r0, "ddp")) < 1e-6
    assert max_diff(weights(r0, "ddp"), weights(r1, "ddp")) == 0.0


def test_fast_ddp_issues_exactly_one_all_reduce_per_optimizer_step(results):
    # 3 optimizer steps of 2 micro-batches each: the accumulating micro-batch reduces nothing.
    assert [r["fast_all_reduces_per_step"] for r in results] == [[1, 1, 1], [1, 1, 1]]


def test_fast_ddp_packs_and_unpacks_through_hpu_graphs_recorded_once(results):
    # 3 steps: recorded once (pack + unpack) at the first reduction, replayed at each of the 3; the eager
    # path would leave both counts at 0. zero_grad() zeroed in place, as optimum-habana under fast_ddp.
    for r in results:
        assert r["fast_graphs"] == [2, 6] and r["fast_grads_kept"]
        # After the gradients were set to None the next reduction recorded both graphs again.
        assert r["no_sync_graphs"] == [4, 8]


def test_no_sync_suppresses_fast_ddp_reduction(results):
    r0, r1 = results
    assert [r["no_sync_all_reduces"] for r in results] == [[0, 1], [0, 1]]
    assert r0["no_sync_local_grad"] != r1["no_sync_local_grad"]  # different data: local gradients differ
    assert r0["no_sync_grad"] == r1["no_sync_grad"]  # then one reduction averaged both backwards
    expected = [(a + b) for a, b in zip(r0["no_sync_local_grad"], r1["no_sync_local_grad"])]
    assert r0["no_sync_grad"] == pytest.approx(expected, rel=1e-5)


def test_mark_step_counts_under_fast_ddp(results):
    # 6 backwards + 3 real optimizer steps, lazy mode (the emulated default).
    assert [r["mark_steps"] for r in results] == [9, 9]


def test_ddp_comm_hook_goes_through_the_core(results):
    r0 = results[0]
    assert "fp16_compress_hook" in r0["fp16_hook"]
    fp16_diff = max_diff(weights(r0, "fp16"), weights(r0, "ddp"))
    assert 0.0 < fp16_diff < 5e-2  # fp16-compressed gradients: close, not identical


def test_context_parallel_size_builds_sequence_groups_and_shards_data_over_dp_only(results):
    for rank, r in enumerate(results):
        # sequence-parallel size 2 and this rank's chunk; one data-parallel shard; the group starts at rank 0
        assert r["cp_mpu"] == [2, rank, 1, 0, 0, 2]
        assert r["cp_batches"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # every batch, on both ranks
        assert r["cp_gathered"] == [rank] and r["cp_reduced"] == [rank + 1.0]  # over the data-parallel group
        assert r["cp_sequence_group_sum"] == 3.0  # the sequence-parallel group holds both ranks
        assert "groups for the ddp and fast_ddp strategies; this Accelerator uses 'fsdp2'" in r["cp_with_fsdp"]


def test_fsdp1_on_the_adapter_device_trains_as_ddp(results):
    for r in results:
        assert r["fsdp1_wrapper"] == ["FullyShardedDataParallel", "SHARD_GRAD_OP"]
        assert max_diff(weights(r, "fsdp1"), weights(results[0], "ddp")) < 1e-5


def test_fsdp2_with_activation_checkpointing_on_the_adapter_device(results):
    r0, r1 = results
    assert r0["fsdp_local_rows"] == 4  # embed's 8 rows, half on each rank
    assert r0["fsdp_checkpoint_wrapped"] == 2  # each ModuleList block recomputed in backward
    # FSDP2 gathers the full state dict on the main process; it trained as DDP did.
    assert max_diff(weights(r0, "fsdp"), weights(r0, "ddp")) < 1e-5
    assert r1["fsdp"] == {}


def test_fast_ddp_under_another_strategy_is_refused(results):
    assert (
        "replaces DDP and runs as the 'fast_ddp' strategy; this Accelerator uses 'fsdp2'"
        in results[0]["fast_with_fsdp"]
    )
    assert "Drop --distribution-strategy fast_ddp" in results[0]["fast_with_fsdp"]


def test_device_map_errors_in_distributed_mode(results):
    for r in results:
        assert "8-bit or 4-bit precision on multiple devices in any distributed mode" in r["quantized_multi_device"]
        assert "loaded with `device_map='auto'` in any distributed mode" in r["device_map_auto"]
