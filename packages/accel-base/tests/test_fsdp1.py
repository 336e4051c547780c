"""FSDP1 (`FSDPConfig(fsdp_version=1)`, Accelerate's default): each option reaches torch's
FullyShardedDataParallel, and 2-process training equals one process; checkpoints round-trip."""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator, FSDPConfig
from accel.strategies.fsdp import FSDP1Strategy, FSDP2Strategy
from conftest import launch
from test_fsdp import MODEL

TRAIN = (
    MODEL
    + """
import copy, sys
from pathlib import Path
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from accel import Accelerator, DistributedType, FSDPConfig, set_seed
from accel.state import AcceleratorState, GradientState

out = Path(sys.argv[1])

def fresh(config, **kwargs):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return Accelerator(fsdp_plugin=config, **kwargs)

def run(name, config, tol=1e-6, mixed_precision="no", accum=1, groups=False, steps=4):
    set_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    acc = fresh(config, mixed_precision=mixed_precision, gradient_accumulation_steps=accum)
    assert acc.distributed_type == DistributedType.FSDP, acc.distributed_type
    r = acc.process_index
    if config.sync_module_states and r == 1:
        with torch.no_grad():  # rank 1 starts elsewhere: sync_module_states must bring rank 0's weights
            for p in model.parameters():
                p.add_(1.0)
    make = lambda m: torch.optim.AdamW(
        [{"params": m.embed.parameters(), "weight_decay": 0.5}, {"params": [*m.blocks.parameters(), *m.head.parameters()]}]
        if groups else m.parameters(), lr=1e-2)
    opt = make(model)
    model, opt = acc.prepare(model, opt)
    assert isinstance(model, FSDP), type(model)
    ref_opt = make(ref)
    for step in range(steps):
        x, y = batch(step)
        n = 4 // accum
        for i in range(4 * r, 4 * r + 4, n):
            with acc.accumulate(model):
                acc.backward(F.cross_entropy(model(x[i : i + n]), y[i : i + n]))
                if acc.sync_gradients:
                    norm = acc.clip_grad_norm_(model.parameters(), 0.5)
                opt.step()
                opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(norm, ref_norm, atol=tol * 10, rtol=tol * 10)
    state = acc.get_state_dict(model)
    if acc.is_main_process:
        expected = ref.state_dict()
        assert set(state) == set(expected), sorted(state)
        for k in expected:
            torch.testing.assert_close(state[k].float(), expected[k], atol=tol, rtol=tol, msg=k)
    inner = acc.unwrap_model(model)
    assert type(inner) is Net, type(inner)
    print(f"RESULT {name} rank{r} ok", flush=True)
    return acc, model, opt

# Every FSDP1 option reaches torch's wrapper; the numbers equal one process.
config = FSDPConfig(fsdp_version=1, sharding_strategy="FULL_SHARD", backward_prefetch="BACKWARD_POST",
                    forward_prefetch=True, limit_all_gathers=False, use_orig_params=True,
                    auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
acc, model, _ = run("full-shard", config, accum=2)
assert not acc.is_fsdp2 and acc.state.fsdp_plugin is config  # Accelerate: is_fsdp2 is fsdp_version == 2
units = [m for m in model.modules() if isinstance(m, FSDP)]
assert len(units) == 3, len(units)  # the root and one per Block
assert (model.sharding_strategy.name, model.backward_prefetch.name, model.forward_prefetch,
        model.limit_all_gathers, model._use_orig_params) == ("FULL_SHARD", "BACKWARD_POST", True, False, True)
assert model.module.embed.weight.numel() < 48  # a shard, not the weight (6 x 8)
# The wrapper's own state_dict() follows state_dict_type and the user's state_dict_config, as in Accelerate.
from torch.distributed.fsdp import FullStateDictConfig
assert FSDP.get_state_dict_type(model).state_dict_type.name == "FULL_STATE_DICT"
acc, model, _ = run("rank0-only", FSDPConfig(fsdp_version=1, state_dict_config=FullStateDictConfig(rank0_only=True)))
own = model.state_dict()
assert (own["embed.weight"].shape == (8, 6)) if acc.is_main_process else own == {}, {k: v.shape for k, v in own.items()}

acc, model, _ = run("shard-grad-op", FSDPConfig(fsdp_version=1, reshard_after_forward="SHARD_GRAD_OP"))
assert model.sharding_strategy.name == "SHARD_GRAD_OP" and model.backward_prefetch is None  # Accelerate passes None
acc, model, _ = run("no-shard", FSDPConfig(fsdp_version=1, sharding_strategy=3))
assert model.sharding_strategy.name == "NO_SHARD"
acc, model, _ = run("hybrid", FSDPConfig(fsdp_version=1, sharding_strategy="HYBRID_SHARD"))
assert model.sharding_strategy.name == "HYBRID_SHARD"

# use_orig_params=False: the optimizer trains the flat parameters, each group keeping its options.
acc, model, opt = run("flat", FSDPConfig(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                                         transformer_cls_names_to_wrap="Block", use_orig_params=False), groups=False)
flat = [p for g in opt.param_groups for p in g["params"]]
from torch.distributed.fsdp._flat_param import FlatParameter
assert len(flat) == 3 and all(isinstance(p, FlatParameter) for p in flat), [type(p) for p in flat]
try:
    run("split", FSDPConfig(fsdp_version=1, use_orig_params=False), groups=True)
except ValueError as e:
    assert "use_orig_params=False flattens" in str(e) and "'<root>'" in str(e), e
    print(f"RESULT split rank{acc.process_index} refused", flush=True)

# sync_module_states: rank 1's different start is replaced by rank 0's.
run("sync", FSDPConfig(fsdp_version=1, sync_module_states=True))
acc, model, _ = run("offload-ckpt", FSDPConfig(fsdp_version=1, cpu_offload=True, activation_checkpointing=True))
assert all(p.device.type == "cpu" for p in model.parameters())  # offload on a host device: already there
assert sum(type(m).__name__ == "CheckpointWrapper" for m in model.modules()) == 2

# cpu_ram_efficient_loading: rank 1 builds on the meta device; rank 0's weights fill it (param_init_fn runs).
set_seed(0)
ref = Net()
calls = []
acc = fresh(FSDPConfig(fsdp_version=1, cpu_ram_efficient_loading=True,
                       param_init_fn=lambda m: (calls.append(type(m).__name__), m.to_empty(device="cpu", recurse=False))))
if acc.process_index == 1:
    with torch.device("meta"):
        model = Net()
else:
    model = copy.deepcopy(ref)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
state = acc.get_state_dict(model)
if acc.is_main_process:
    assert all(torch.equal(state[k], v) for k, v in ref.state_dict().items())
print(f"RESULT meta rank{acc.process_index} ok", flush=True)

# bf16: parameters, reduction and buffers in bf16 as Accelerate's FSDP1 policy.
acc, model, _ = run("bf16", FSDPConfig(fsdp_version=1), tol=3e-2, mixed_precision="bf16")
mp = model.mixed_precision
assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == (torch.bfloat16,) * 3, mp

# fp16: torch's ShardedGradScaler with the scaler settings; an inf in one rank's shard skips the step everywhere.
from accel import GradScalerKwargs
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
set_seed(0)
acc = fresh(FSDPConfig(fsdp_version=1), mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=512.0)])
assert isinstance(acc.scaler, ShardedGradScaler) and acc.scaler.get_scale() == 512.0, acc.scaler
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
x, y = batch(0)
acc.backward(F.cross_entropy(model(x), y))
before = [p.detach().clone() for p in model.parameters()]
if acc.process_index == 1:
    next(p for p in model.parameters() if p.grad is not None and p.grad.numel()).grad[0] = float("inf")
opt.step()
assert opt.step_was_skipped and acc.scaler.get_scale() == 256.0, (opt.step_was_skipped, acc.scaler.get_scale())
assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
print(f"RESULT fp16-skip rank{acc.process_index} ok", flush=True)

# Checkpoints: full and sharded, original or flat parameters, all resume exactly.
for kind, orig in (("FULL_STATE_DICT", True), ("SHARDED_STATE_DICT", True), ("FULL_STATE_DICT", False),
                   ("SHARDED_STATE_DICT", False)):
    config = lambda: FSDPConfig(fsdp_version=1, state_dict_type=kind, auto_wrap_policy="transformer_based_wrap",
                                transformer_cls_names_to_wrap=["Block"], use_orig_params=orig)
    kind_dir = f"{kind}-{orig}"
    set_seed(0)
    acc = fresh(config())
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    def step(i):
        x, y = batch(i)
        r = acc.process_index
        acc.backward(F.cross_entropy(model(x[4 * r : 4 * r + 4]), y[4 * r : 4 * r + 4]))
        opt.step()
        opt.zero_grad()
    step(0)
    acc.save_state(out / kind_dir)
    step(1)
    expected = acc.get_state_dict(model)
    set_seed(1)
    acc = fresh(config())
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    acc.load_state(out / kind_dir)
    step(1)
    got = acc.get_state_dict(model)
    if acc.is_main_process:
        for k, v in expected.items():
            assert torch.equal(got[k], v), k
    print(f"RESULT resume-{kind_dir} rank{acc.process_index} ok", flush=True)
"""
)


def test_fsdp1_options_reach_torchs_wrapper_and_train_like_one_process(write_script, tmp_path) -> None:
    proc = launch(write_script(TRAIN), str(tmp_path), timeout=300)
    out = proc.stdout
    for name in (
        "full-shard",
        "rank0-only",
        "shard-grad-op",
        "no-shard",
        "hybrid",
        "flat",
        "sync",
        "offload-ckpt",
        "meta",
        "bf16",
        "fp16-skip",
    ):
        for rank in (0, 1):
            assert f"RESULT {name} rank{rank} ok" in out, out
    for rank in (0, 1):
        assert f"RESULT split rank{rank} refused" in out, out
        for kind in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
            for orig in (True, False):
                assert f"RESULT resume-{kind}-{orig} rank{rank} ok" in out, out


def test_fsdp_version_1_selects_fsdp1_and_reads_accelerates_forms() -> None:
    config = FSDPConfig(fsdp_version=1, reshard_after_forward="2", backward_prefetch=1, cpu_ram_efficient_loading=True)
    assert (config.sharding_strategy, config.backward_prefetch, config.sync_module_states) == (
        "SHARD_GRAD_OP",
        "BACKWARD_PRE",
        True,
    )
    assert type(FSDP2Strategy(config)) is FSDP1Strategy
    assert type(FSDP2Strategy(FSDPConfig())) is FSDP2Strategy
    assert type(Accelerator(fsdp_plugin=FSDPConfig(fsdp_version=1)).strategy) is FSDP1Strategy
    # NO_PREFETCH is Accelerate's name for none.
    assert FSDPConfig(fsdp_version=1, backward_prefetch="NO_PREFETCH").backward_prefetch is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reshard_after_forward": True}, "reshard_after_forward set to True. This is not supported with FSDP1"),
        ({"sharding_strategy": "EVERYWHERE"}, "sharding_strategy must be one of FULL_SHARD"),
        ({"backward_prefetch": "SOON"}, "backward_prefetch must be one of BACKWARD_PRE, BACKWARD_POST"),
        ({"activation_checkpointing_offload": True}, "requires `fsdp_version=2`"),
        ({"mixed_precision_policy": 3}, "Under fsdp_version=1, mixed_precision_policy must be"),
    ],
)
def test_bad_fsdp1_settings_are_refused_with_accelerates_messages(kwargs: dict, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        FSDPConfig(fsdp_version=1, **kwargs).fsdp1_mixed_precision("bf16")


def test_a_tensor_parallel_mesh_needs_fsdp2() -> None:
    from accel import ParallelismConfig

    with pytest.raises(ValueError, match="composes with FSDP2 only: set fsdp_version=2"):
        FSDP1Strategy(FSDPConfig(fsdp_version=1)).build_mesh(None, ParallelismConfig(tp_size=2))  # type: ignore[arg-type]
    assert torch.distributed.is_available()
