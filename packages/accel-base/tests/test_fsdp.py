"""FSDP2: configuration, wrap policies, and 2-process training and checkpoints against a
single-process reference."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from accel import Accelerator, FSDPConfig, FullyShardedDataParallelPlugin, UnsafeCheckpointError
from accel.strategies.fsdp import MODEL_WITHOUT_OPTIMIZER, FSDP2Strategy, wrap_targets
from conftest import launch
from safetensors.torch import load_file
from torch import nn

# A tiny transformer-shaped model: blocks in a ModuleList, so the default policy has
# something to wrap. Shared by the workers (through the script text) and the checks here.
MODEL = """
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, d, p):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.down(torch.relu(self.up(x))))

class Net(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.embed = nn.Linear(6, 8)
        self.blocks = nn.ModuleList([Block(8, p) for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
"""
exec(MODEL)

TRAIN = (
    MODEL
    + """
import copy, sys
from pathlib import Path
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from accel import Accelerator, DistributedType, FSDPConfig, set_seed
from accel.state import AcceleratorState, GradientState

out = Path(sys.argv[1])

def run(config, mixed_precision, tol, optim=lambda ps: torch.optim.AdamW(ps, lr=1e-2), accum=1):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    set_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    init = copy.deepcopy(model.state_dict())
    acc = Accelerator(fsdp_plugin=config, mixed_precision=mixed_precision, gradient_accumulation_steps=accum)
    assert acc.distributed_type == DistributedType.FSDP, acc.distributed_type
    opt = optim(model.parameters())
    model, opt = acc.prepare(model, opt)
    # Sharded for real: each rank holds half of every weight's rows.
    w = model.embed.weight
    assert isinstance(w, DTensor) and w.to_local().shape == (4, 6), (type(w), w.to_local().shape)
    seen = []
    model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ref_opt = optim(ref.parameters())
    r = acc.process_index
    for step in range(5):
        x, y = batch(step)
        n = 4 // accum
        for i in range(4 * r, 4 * r + 4, n):
            with acc.accumulate(model):
                acc.backward(F.cross_entropy(model(x[i : i + n]), y[i : i + n]))
                if acc.sync_gradients:
                    norm = acc.clip_grad_norm_(model.parameters(), 0.5)
                elif step == 0:
                    # No reduce-scatter yet: FSDP2 keeps the gradient unsharded, off the shards.
                    assert all(p.grad is None for p in model.parameters())
                opt.step()
                opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        assert type(norm) is torch.Tensor, type(norm)
        torch.testing.assert_close(norm, ref_norm, atol=tol * 10, rtol=tol * 10)
    state = acc.get_state_dict(model)
    expected = ref.state_dict()
    if acc.is_main_process:
        assert set(state) == set(expected), sorted(state)
        for k in expected:
            assert state[k].device.type == "cpu" and not isinstance(state[k], DTensor)
            torch.testing.assert_close(state[k], expected[k], atol=tol, rtol=tol, msg=k)
            assert (state[k] - init[k]).abs().max() > 5 * tol, k  # it trained
    return acc, model, expected, seen

# fp32, default policy: equal to one process.
acc, model, expected, seen = run(FSDPConfig(), "no", 1e-6)
assert seen == [torch.float32] * 5, seen
acc.save_model(model, out / "saved")
if acc.is_main_process:
    plain = Net()
    plain.load_state_dict(load_file(str(out / "saved" / "model.safetensors")), strict=True)
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(v, expected[k], atol=1e-6, rtol=1e-6, msg=k)

# CPU offload (no pinning on a CPU), activation checkpointing, no reshard: same numbers.
acc, model, _, _ = run(
    FSDPConfig(cpu_offload=True, activation_checkpointing=True, reshard_after_forward=False), "no", 1e-6
)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
wrappers = [m for m in model.modules() if isinstance(m, CheckpointWrapper)]
assert len(wrappers) == 2, len(wrappers)

# Gradient accumulation: 2 micro-batches per step, gradients reduced only on the second.
run(FSDPConfig(), "no", 1e-6, accum=2)

# bf16: parameters gathered in bf16 for compute, fp32 master shards. With SGD the weights
# move by 0.017-0.11 and stay within 1.2e-3 of fp32 (measured; Adam would turn the
# rounding of tiny gradients into full-size steps).
acc, model, _, seen = run(FSDPConfig(), "bf16", 2e-3, lambda ps: torch.optim.SGD(ps, lr=0.5))
assert seen == [torch.bfloat16] * 5, seen
assert model.embed.weight.dtype == torch.float32
acc.print("TRAIN OK")
"""
)

RESUME = (
    MODEL
    + """
import sys
from pathlib import Path
import torch.nn.functional as F
from accel import Accelerator, FSDPConfig, set_seed

mode, out, total, save_at = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
set_seed(0)
acc = Accelerator(fsdp_plugin=FSDPConfig(state_dict_type=sys.argv[5] if mode == "resume" else "FULL_STATE_DICT"))
model = Net(p=0.2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
model, opt, sched = acc.prepare(model, opt, sched)
# Dropout differs per rank, so each rank's RNG must come back as it was.
torch.manual_seed(100 + acc.process_index)
start = 0
if mode == "resume":
    acc.load_state(out / sys.argv[5])
    start = save_at
r = acc.process_index
for step in range(start, total):
    if mode == "run" and step == save_at:
        for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            acc.strategy.config.set_state_dict_type(kind)
            acc.save_state(out / kind)
    x, y = batch(step)
    loss = F.cross_entropy(model(x[4 * r : 4 * r + 4]), y[4 * r : 4 * r + 4])
    acc.backward(loss)
    opt.step()
    sched.step()
    opt.zero_grad()
acc.save_model(model, out / f"final_{mode}_{sys.argv[5] if mode == 'resume' else 'run'}")
"""
)


def _net() -> nn.Module:
    return Net()  # type: ignore[name-defined]  # noqa: F821


# ---- in-process: configuration and policies -------------------------------------------
def test_model_without_optimizer_is_refused() -> None:
    acc = Accelerator(strategy="fsdp2")
    model = _net()
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="a model and optimizer must be passed together"):
        acc.prepare(model)
    with pytest.raises(ValueError, match="optimizer needs to have its parameters modified"):
        acc.prepare(opt)
    assert MODEL_WITHOUT_OPTIMIZER.startswith("When using FSDP2")


def test_plugin_selects_the_strategy_and_alias() -> None:
    config = FullyShardedDataParallelPlugin(state_dict_type="sharded_state_dict")
    acc = Accelerator(fsdp_plugin=config)
    assert isinstance(acc.strategy, FSDP2Strategy)
    assert acc.strategy.config is config and config.state_dict_type == "SHARDED_STATE_DICT"
    assert FullyShardedDataParallelPlugin is FSDPConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fsdp_version": 3}, "fsdp_version must be 1 \\(FullyShardedDataParallel\\) or 2"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, "FSDP2 does not support LOCAL_STATE_DICT"),
        ({"auto_wrap_policy": "everything"}, "auto_wrap_policy must be one of"),
        ({"min_num_params": -1}, "min_num_params must be >= 0"),
    ],
)
def test_bad_config_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FSDPConfig(**kwargs)


def test_wrap_policies() -> None:
    model = _net()
    blocks = list(model.blocks)
    assert wrap_targets(model, FSDPConfig()) == blocks
    assert wrap_targets(model, FSDPConfig(auto_wrap_policy="no_wrap")) == []
    assert wrap_targets(model, FSDPConfig(transformer_cls_names_to_wrap=["Block"], auto_wrap_policy="transformer_based_wrap")) == blocks[::-1]  # fmt: skip
    assert wrap_targets(model, FSDPConfig(auto_wrap_policy=lambda m: isinstance(m, nn.Linear) and m.out_features == 3)) == [model.head]  # fmt: skip
    # Each Linear(8, 16) has 144 parameters, each Linear(16, 8) 136: at 140 only the up
    # projections qualify alone; a block's leftovers (136) do not, and the ModuleList
    # holding both (272) has no forward to wrap, so the rest stays with the root.
    size = wrap_targets(model, FSDPConfig(min_num_params=140))
    assert size == [blocks[1].up, blocks[0].up]
    assert wrap_targets(model, FSDPConfig(min_num_params=130)) == [blocks[1].down, blocks[1].up, blocks[0].down, blocks[0].up]  # fmt: skip
    with pytest.raises(ValueError, match=r"Could not find the transformer layer class \['Missing'\]"):
        wrap_targets(model, FSDPConfig(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Missing"]))  # fmt: skip
    with pytest.raises(ValueError, match="needs `transformer_cls_names_to_wrap`"):
        wrap_targets(model, FSDPConfig(auto_wrap_policy="transformer_based_wrap"))


def test_precision_and_offload_policies() -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy

    bf16 = FSDPConfig().mp_policy("bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert FSDPConfig().mp_policy("no").param_dtype is None
    custom = FSDPConfig(mixed_precision_policy={"param_dtype": "float16"}).mp_policy("bf16")
    assert custom.param_dtype == torch.float16
    offload = FSDPConfig(cpu_offload=True).offload_policy(torch.device("cpu"))
    assert isinstance(offload, CPUOffloadPolicy) and offload.pin_memory is False
    assert FSDPConfig(cpu_offload=True).offload_policy(torch.device("meta")).pin_memory is True
    assert not isinstance(FSDPConfig().offload_policy(torch.device("cpu")), CPUOffloadPolicy)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_metadata_with_code_is_refused(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from accel.checkpoint.dcp import safe_reader

    good = tmp_path / "good"
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(good), no_dist=True)
    assert safe_reader(good).read_metadata().state_dict_metadata["w"].size == torch.Size([2])

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(UnsafeCheckpointError, match=r"references pathlib.Path.touch|references pathlib"):
        safe_reader(bad).read_metadata()
    assert not marker.exists()


# ---- 2 gloo processes -----------------------------------------------------------------------
def test_fsdp2_training_matches_one_process(write_script, tmp_path: Path) -> None:
    proc = launch(write_script(TRAIN), str(tmp_path), timeout=240)
    assert "TRAIN OK" in proc.stdout
    assert (tmp_path / "saved" / "model.safetensors").is_file()


def test_exact_resume_full_and_sharded(write_script, tmp_path: Path) -> None:
    script = write_script(RESUME)
    launch(script, "run", str(tmp_path), "6", "3", "-", timeout=240)
    full, sharded = tmp_path / "FULL_STATE_DICT", tmp_path / "SHARDED_STATE_DICT"
    # Full: the same files as an unsharded run, loadable into a plain module.
    plain = _net()
    plain.load_state_dict(load_file(str(full / "model.safetensors")), strict=True)
    assert (full / "optimizer.bin").is_file() and not (full / "pytorch_model_fsdp_0").exists()
    # Sharded: one file per rank per object, no gathered copy.
    assert sorted(p.name for p in (sharded / "pytorch_model_fsdp_0").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # fmt: skip
    assert (sharded / "optimizer_0" / ".metadata").is_file() and not (sharded / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.accel-tmp"))

    reference = load_file(str(tmp_path / "final_run_run" / "model.safetensors"))
    assert not torch.equal(reference["head.weight"], plain.state_dict()["head.weight"])
    for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        launch(script, "resume", str(tmp_path), "6", "3", kind, timeout=240)
        resumed = load_file(str(tmp_path / f"final_resume_{kind}" / "model.safetensors"))
        assert set(resumed) == set(reference)
        for name, value in reference.items():
            assert torch.equal(resumed[name], value), (kind, name, (resumed[name] - value).abs().max())
