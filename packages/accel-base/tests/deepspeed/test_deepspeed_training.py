"""The DeepSpeed strategy on DeepSpeed's real CPU accelerator, 2 gloo processes, against a
single-process plain-PyTorch reference computed here from the same batches.

One launch trains every configuration (DeepSpeed's import and group setup cost more than
the training), another checks checkpoints, save_model and zero3_init.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import launch

COMMON = """
import copy, sys
from pathlib import Path
import torch, torch.nn.functional as F
from torch import nn
from accel import Accelerator, set_seed
from accel.state import AcceleratorState, GradientState
from accel.strategies.deepspeed import DeepSpeedPlugin, DummyOptim, DummyScheduler

RANKS, PER_RANK = 2, 4

def net():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))

def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(RANKS * PER_RANK, 6, generator=g), torch.randint(0, 3, (RANKS * PER_RANK,), generator=g)

def rank_slice(rank, micro, accum):
    n = PER_RANK // accum
    start = rank * PER_RANK + micro * n
    return slice(start, start + n)

def fresh(**kwargs):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(0)
    return Accelerator(**kwargs)

def loader():
    # Only its batch size matters: it fills train_micro_batch_size_per_gpu ("auto").
    return torch.utils.data.DataLoader(list(range(RANKS * PER_RANK)), batch_size=PER_RANK)

def reference_step(ref, ref_opt, step, accum, clip=None):
    # What the engine computes: each rank accumulates loss/accum over its micro-batches,
    # then the ranks' gradients are averaged (halving is exact in floating point).
    x, y = batch(step)
    total = None
    for r in range(RANKS):
        ref.zero_grad()
        for m in range(accum):
            s = rank_slice(r, m, accum)
            (F.cross_entropy(ref(x[s]), y[s]) / accum).backward()
        grads = [p.grad.clone() for p in ref.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    for p, g in zip(ref.parameters(), total):
        p.grad = g / RANKS
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip) if clip else None
    ref_opt.step()
    ref_opt.zero_grad()
    return norm

def train(acc, model, opt, step, accum, clip=None):
    x, y = batch(step)
    norm = None
    for m in range(accum):
        s = rank_slice(acc.process_index, m, accum)
        with acc.accumulate(model):
            acc.backward(F.cross_entropy(model(x[s]), y[s]))
            if acc.sync_gradients and clip:
                norm = acc.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
    return norm
"""

TRAIN = (
    COMMON
    + """
import deepspeed
import deepspeed.comm as ds_comm

def run(name, plugin, make_opt, steps=4, accum=1, clip=None, tol=0.0, mixed_precision="no"):
    acc = fresh(deepspeed_plugin=plugin, gradient_accumulation_steps=accum, mixed_precision=mixed_precision)
    model = net()
    ref = copy.deepcopy(model)
    init = {k: v.clone() for k, v in ref.state_dict().items()}
    model, opt, _ = acc.prepare(model, make_opt(model.parameters()), loader())
    assert isinstance(model, deepspeed.DeepSpeedEngine), type(model)
    ref_opt = make_opt(ref.parameters())
    for step in range(steps):
        norm = train(acc, model, opt, step, accum, clip)
        ref_norm = reference_step(ref, ref_opt, step, accum, clip)
        if clip:
            torch.testing.assert_close(norm, ref_norm, atol=max(tol, 1e-6), rtol=max(tol, 1e-6))
    state = acc.get_state_dict(model)
    worst = 0.0
    for k, v in ref.state_dict().items():
        got = state[k].float()
        worst = max(worst, (got - v).abs().max().item())
        assert (v - init[k]).abs().max() > 1e-3, (name, k, "did not train")
    assert worst <= tol, (name, worst, tol)
    acc.print(f"RESULT {name} max|diff|={worst:.3g}")
    return acc, model

sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)
adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2)

# The Accelerator's gloo group is reused, whatever DeepSpeed's CPU accelerator would prefer.
for stage in (0, 1, 2, 3):
    acc, model = run(f"zero{stage}-sgd", DeepSpeedPlugin(zero_stage=stage), sgd)
    assert torch.distributed.get_backend() == "gloo"
    assert ds_comm.get_world_size() == 2 and ds_comm.is_initialized()
    if stage == 3:
        # Really sharded: each rank holds half of every parameter.
        shard = model.module[0].weight.ds_tensor.numel()
        assert shard == 16 * 6 // 2, shard
        assert model.module[0].weight.numel() == 0

# Accumulation (boundary from sync_gradients) with clipping in the engine, and AdamW.
run("zero2-accum2-clip-adamw", DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.3), adamw, accum=2, clip=0.3, tol=1e-6)
run("zero3-accum2-sgd", DeepSpeedPlugin(zero_stage=3), sgd, accum=2, tol=1e-6)
# Optimizer state and step on the CPU (ZeRO-Offload) with a torch optimizer.
offload = DeepSpeedPlugin(
    zero_stage=2, offload_optimizer_device="cpu", extra_config={"zero_force_ds_cpu_optimizer": False}
)
run("zero2-offload-cpu-adamw", offload, adamw, tol=1e-6)
offload3 = DeepSpeedPlugin(
    zero_stage=3,
    offload_optimizer_device="cpu",
    offload_param_device="cpu",
    extra_config={"zero_force_ds_cpu_optimizer": False},
)
run("zero3-offload-params-sgd", offload3, sgd, tol=1e-6)
# An Accelerate user's offload config as is (no `zero_force_ds_cpu_optimizer`): the torch optimizer
# becomes DeepSpeed's CPU Adam, decoupled weight decay for AdamW and L2 for Adam, as Accelerate maps
# it; the reference is the torch optimizer itself (a wrong adamw_mode is off by ~1e-3 here).
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

adamw_wd = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)
adam_wd = lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)
adagrad = lambda ps: torch.optim.Adagrad(ps, lr=1e-1)
for name, plugin, make_opt, expected, adamw_mode in (
    ("zero2-offload-cpuadam-adamw", DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu"), adamw_wd,
     DeepSpeedCPUAdam, True),
    ("zero3-offload-cpuadam-adam", DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu",
     offload_param_device="cpu"), adam_wd, DeepSpeedCPUAdam, False),
    ("zero2-offload-cpuadagrad", DeepSpeedPlugin(zero_stage=2, offload_optimizer_device="cpu",
     gradient_clipping=0.0), adagrad,
     DeepSpeedCPUAdagrad, None),
):
    assert plugin.maps_client_optimizer
    acc, model = run(name, plugin, make_opt, tol=1e-5)
    inner = model.basic_optimizer
    assert type(inner) is expected, (name, type(inner))
    assert adamw_mode is None or inner.adam_w_mode is adamw_mode, (name, inner.adam_w_mode)
# bf16 from the Accelerator's mixed_precision: the engine trains bf16 weights with fp32 masters.
acc, model = run("zero2-bf16-sgd", DeepSpeedPlugin(zero_stage=2), sgd, tol=5e-3, mixed_precision="bf16")
assert acc.strategy.ds_config["bf16"] == {"enabled": True}
assert model.module[0].weight.dtype == torch.bfloat16

# Clipping in the loop under DeepSpeed, as Accelerate does it: the plugin's gradient_clipping defaults
# to 1.0, clip_grad_norm_ returns the engine's global norm whatever max_norm is, and a max_norm the
# engine does not use is said once in the log (not silently ignored, not an error).
import logging

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("accel").addHandler(handler)
acc, model = run("zero1-sgd", DeepSpeedPlugin(zero_stage=1), sgd, steps=1)
assert acc.strategy.ds_config["gradient_clipping"] == 1.0, acc.strategy.ds_config
x, y = batch(0)
acc.backward(F.cross_entropy(model(x[:4]), y[:4]))
norm = acc.clip_grad_norm_(model.parameters(), 1.0)
assert torch.isfinite(norm) and float(norm) > 0, norm
assert not records, [r.getMessage() for r in records]
for _ in range(2):
    again = acc.clip_grad_norm_(model.parameters(), 0.5)
    assert float(again) == float(norm), (again, norm)
messages = [r.getMessage() for r in records]
assert len(messages) == 1 and "gradient_clipping=1.0" in messages[0] and "max_norm=0.5" in messages[0], messages
acc.print("DONE")
"""
)


def test_zero_stages_offload_accumulation_bf16_match_one_process(write_script):
    proc = launch(write_script(TRAIN), timeout=900)
    out = proc.stdout
    for name in ("zero0-sgd", "zero1-sgd", "zero2-sgd", "zero3-sgd"):
        # A torch SGD client optimizer equals the reference exactly.
        assert f"RESULT {name} max|diff|=0" in out, out
    for name in (
        "zero2-accum2-clip-adamw",
        "zero3-accum2-sgd",
        "zero2-offload-cpu-adamw",
        "zero3-offload-params-sgd",
        "zero2-offload-cpuadam-adamw",
        "zero3-offload-cpuadam-adam",
        "zero2-offload-cpuadagrad",
    ):
        assert f"RESULT {name} " in out, out
    assert "RESULT zero2-bf16-sgd " in out and "DONE" in out, out


CHECKPOINT = (
    COMMON
    + """
from safetensors.torch import load_file

out = Path(sys.argv[1])
plugin = lambda: DeepSpeedPlugin(zero_stage=3, gradient_clipping=0.5)

def setup(build=net):
    acc = fresh(deepspeed_plugin=plugin())
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched, _ = acc.prepare(model, opt, sched, loader())
    return acc, model, opt, sched

# Exact resume through the engine's checkpoint format (ZeRO-3 shards, AdamW moments, scheduler).
acc, model, opt, sched = setup()
for step in range(2):
    train(acc, model, opt, step, 1, clip=0.5)
acc.save_state(out / "ckpt")
lrs = [sched.get_last_lr()]
for step in range(2, 4):
    train(acc, model, opt, step, 1, clip=0.5)
    lrs.append(sched.get_last_lr())
expected = acc.get_state_dict(model)
assert lrs[-1][0] == 1e-2 * 0.5**4, lrs  # the engine stepped the scheduler once per optimizer step

acc, model, opt, sched = setup()
acc.load_state(out / "ckpt")
assert sched.get_last_lr() == lrs[0], (sched.get_last_lr(), lrs)
for step in range(2, 4):
    train(acc, model, opt, step, 1, clip=0.5)
resumed = acc.get_state_dict(model)
for k, v in expected.items():
    assert torch.equal(resumed[k], v), k
acc.print("RESUME exact")

# save_model gathers the full weights into safetensors that load into a plain module.
acc.save_model(model, out / "saved")
if acc.is_main_process:
    plain = net()
    plain.load_state_dict(load_file(str(out / "saved" / "model.safetensors")), strict=True)
    for k, v in plain.state_dict().items():
        assert torch.equal(v, expected[k]), k
    acc.print("SAVE_MODEL plain load ok")
acc.wait_for_everyone()
# The fp32 master weights (zero3_save_16bit_model=False) equal the module's under fp32 training.
acc.strategy.plugin.zero3_save_16bit_model = False
masters = acc.get_state_dict(model)
for k, v in expected.items():
    assert masters[k].dtype == torch.float32 and torch.equal(masters[k], v), k
acc.print("FP32_MASTERS ok")

# zero3_init: the model is built sharded and trains like the reference built the same way.
AcceleratorState._reset_state()
GradientState._reset_state()
set_seed(0)
ref = net()
acc = fresh(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3))
with acc.strategy.zero3_init(acc):
    model = net()
w = model[0].weight
assert w.numel() == 0 and w.ds_tensor.numel() == 16 * 6 // 2, (w.shape, w.ds_tensor.shape)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt, _ = acc.prepare(model, opt, loader())
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(3):
    train(acc, model, opt, step, 1)
    reference_step(ref, ref_opt, step, 1)
state = acc.get_state_dict(model)
for k, v in ref.state_dict().items():
    torch.testing.assert_close(state[k], v, atol=1e-6, rtol=1e-6, msg=k)
acc.print("ZERO3_INIT ok")

# Optimizer and scheduler from the DeepSpeed config, through the stand-ins.
config = {
    "zero_optimization": {},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto", "warmup_num_steps": "auto", "warmup_type": "linear"},
    },
}
acc = fresh(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config, zero_stage=2))
model = net()
ref = copy.deepcopy(model)
opt = DummyOptim(model.parameters(), lr=1e-2, weight_decay=0.0)
sched = DummyScheduler(opt, warmup_num_steps=4)
model, opt, sched, _ = acc.prepare(model, opt, sched, loader())
assert type(opt.optimizer.optimizer).__name__ != "DummyOptim"
ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
lrs = []
for step in range(3):
    # The reference steps with the lr the engine's scheduler set for this step.
    lrs.append(opt.param_groups[0]["lr"])
    ref_opt.param_groups[0]["lr"] = lrs[-1]
    train(acc, model, opt, step, 1)
    reference_step(ref, ref_opt, step, 1)
lrs.append(sched.get_last_lr()[0])
# DeepSpeed's linear WarmupLR: lr = max_lr * k / warmup_num_steps after k steps (k >= 1).
torch.testing.assert_close(lrs[1:], [1e-2 * k / 4 for k in range(3)], msg=str(lrs))
state = acc.get_state_dict(model)
for k, v in ref.state_dict().items():
    torch.testing.assert_close(state[k], v, atol=1e-6, rtol=1e-6, msg=k)
acc.print("DUMMY ok")
"""
)


def test_zero3_exact_resume_save_model_zero3_init_and_config_optimizer(write_script, tmp_path: Path):
    proc = launch(write_script(CHECKPOINT), str(tmp_path), timeout=900)
    for marker in ("RESUME exact", "SAVE_MODEL plain load ok", "FP32_MASTERS ok", "ZERO3_INIT ok", "DUMMY ok"):
        assert marker in proc.stdout, proc.stdout


ONE_PROCESS = (
    COMMON
    + """
RANKS, PER_RANK = 1, 8  # one process sees the whole batch; the reference is plain training
acc = fresh(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
assert acc.num_processes == 1
model = net()
ref = copy.deepcopy(model)
model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader())
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for step in range(3):
    train(acc, model, opt, step, 1)
    reference_step(ref, ref_opt, step, 1)
state = acc.get_state_dict(model)
for k, v in ref.state_dict().items():
    assert torch.equal(state[k], v), k
print("ONE_PROCESS exact")
"""
)


def test_one_process_builds_its_own_group_and_trains_exactly(write_script):
    proc = launch(write_script(ONE_PROCESS), nproc=1, timeout=600)
    assert "ONE_PROCESS exact" in proc.stdout, proc.stdout


ZERO3_INIT_FLAG = """
import sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.state import AcceleratorState, GradientState
from accel.strategies.deepspeed import DeepSpeedPlugin
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
from transformers.integrations import is_deepspeed_zero3_enabled

out = Path(sys.argv[1])
config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
WTE = 64 * 16

def fresh(plugin):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(deepspeed_plugin=plugin)

def loader():
    return torch.utils.data.DataLoader(list(range(8)), batch_size=4)

# Accelerate's default under ZeRO-3: zero3_init_flag on, transformers sees ZeRO-3.
acc = fresh(DeepSpeedPlugin(zero_stage=3))
plugin = acc.strategy.plugin
assert plugin.zero3_init_flag is True and is_deepspeed_zero3_enabled()
with plugin.zero3_init_context_manager(enable=False):
    assert not is_deepspeed_zero3_enabled()
    if acc.is_main_process:
        torch.manual_seed(0)
        GPT2LMHeadModel(config).save_pretrained(out / "tiny")
assert is_deepspeed_zero3_enabled()
acc.wait_for_everyone()
saved = load_file(str(out / "tiny" / "model.safetensors"))

# from_pretrained: built partitioned (each process holds half of each weight), loaded exactly.
model = GPT2LMHeadModel.from_pretrained(out / "tiny")
w = model.transformer.wte.weight
assert w.numel() == 0 and w.ds_tensor.numel() == WTE // 2, (w.shape, w.ds_tensor.shape)
engine, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader())
state = acc.get_state_dict(engine)
for k, v in saved.items():
    assert torch.equal(state[k], v), k
ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(acc.process_index))
loss = engine(input_ids=ids, labels=ids).loss
acc.backward(loss)
assert torch.isfinite(loss), loss
acc.print("FROM_PRETRAINED partitioned")

# from_config: built partitioned too.
model = AutoModelForCausalLM.from_config(config)
assert model.transformer.wte.weight.ds_tensor.numel() == WTE // 2
acc.print("FROM_CONFIG partitioned")

# zero3_init_flag=False: transformers builds the model whole on every process.
acc = fresh(DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False))
assert not is_deepspeed_zero3_enabled()
model = GPT2LMHeadModel.from_pretrained(out / "tiny")
w = model.transformer.wte.weight
assert w.numel() == WTE and not hasattr(w, "ds_tensor")
assert torch.equal(w, saved["transformer.wte.weight"])
acc.print("FLAG_OFF whole")
"""


def test_zero3_init_flag_partitions_transformers_models_as_they_are_built(write_script, tmp_path: Path):
    pytest.importorskip("transformers")
    proc = launch(write_script(ZERO3_INIT_FLAG), str(tmp_path), timeout=900)
    for marker in ("FROM_PRETRAINED partitioned", "FROM_CONFIG partitioned", "FLAG_OFF whole"):
        assert marker in proc.stdout, proc.stdout


SAVE_KWARGS = """
import sys
from pathlib import Path
import pytest, torch
from accel import Accelerator
from accel.strategies.deepspeed import DeepSpeedPlugin

out = Path(sys.argv[1])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
model[0].requires_grad_(False)  # a frozen layer, as under PEFT
acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)
trainable = [p for p in model.parameters() if p.requires_grad]
engine, opt, loader = acc.prepare(model, torch.optim.SGD(trainable, lr=0.1), loader)

def module_keys(directory):
    files = sorted(Path(directory).rglob("*model_states.pt"))
    assert files, list(Path(directory).rglob("*"))
    return set(torch.load(files[0], weights_only=False)["module"])

acc.save_state(out / "all")
acc.save_state(out / "trainable", exclude_frozen_parameters=True)  # Accelerate passes it to save_checkpoint
assert {"0.weight", "0.bias"} <= module_keys(out / "all"), module_keys(out / "all")
assert module_keys(out / "trainable") == {"1.weight", "1.bias"}, module_keys(out / "trainable")
with pytest.raises(ValueError, match=r"save_state\\(tag=...\\): accel sets these for the 'deepspeed' strategy"):
    acc.save_state(out / "tagged", tag="mine")
assert not (out / "tagged").exists()
acc.print("SAVE_KWARGS reach save_checkpoint")
# load_state's keywords reach load_checkpoint, as in Accelerate: DeepSpeed calls the custom loader with the saved
# module state instead of loading it itself; keywords accel sets itself (the tag) are refused by name.
seen = []
def custom_load_fn(src, dst):
    seen.append(sorted(src))
    dst.load_state_dict(src, strict=False)
acc.load_state(out / "all", custom_load_fn=custom_load_fn, load_optimizer_states=False)
assert seen and "1.weight" in seen[0], seen
from accel.accelerator import UnsupportedLoadArgumentError
with pytest.raises(UnsupportedLoadArgumentError, match="tag= cannot be honoured"):
    acc.load_state(out / "all", tag="mine")
acc.print("LOAD_KWARGS reach load_checkpoint")
"""


def test_save_and_load_state_keyword_arguments_reach_deepspeeds_engine(write_script, tmp_path: Path):
    proc = launch(write_script(SAVE_KWARGS), str(tmp_path), nproc=1, timeout=600)
    assert "SAVE_KWARGS reach save_checkpoint" in proc.stdout, proc.stdout
    assert "LOAD_KWARGS reach load_checkpoint" in proc.stdout, proc.stdout


DEEPSPEED_CONFIG_VIEW = """
import torch
from accel import Accelerator
from accel.strategies.deepspeed import DeepSpeedPlugin

user = {"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}
plugin = DeepSpeedPlugin(hf_ds_config=user, gradient_accumulation_steps=2)
acc = Accelerator(deepspeed_plugin=plugin)
config = acc.state.deepspeed_plugin.deepspeed_config
assert acc.deepspeed_config is config
# Before prepare: Accelerate's view, "auto" where prepare fills a value.
assert config["train_micro_batch_size_per_gpu"] == "auto" and config["train_batch_size"] == "auto", config
assert config["gradient_accumulation_steps"] == 2 and config["zero_optimization"]["stage"] == 1, config
# Accelerate's way to run without a data loader in prepare: the micro batch set in the config.
config["train_micro_batch_size_per_gpu"] = 3
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
engine, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
assert engine.train_micro_batch_size_per_gpu() == 3 and engine.gradient_accumulation_steps() == 2
after = acc.deepspeed_config
assert after is config and after["train_batch_size"] == 3 * 2 * acc.num_processes, after
assert "auto" not in repr(after) and after["gradient_clipping"] == 0.5, after
assert user == {"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}, "the user's dict is not touched"
acc.print("DEEPSPEED_CONFIG live view")
"""


def test_deepspeed_config_is_accelerates_live_view(write_script):
    proc = launch(write_script(DEEPSPEED_CONFIG_VIEW), nproc=1, timeout=600)
    assert "DEEPSPEED_CONFIG live view" in proc.stdout, proc.stdout
