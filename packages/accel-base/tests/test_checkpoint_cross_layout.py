"""A checkpoint loads into the run it fits, whatever layout saved it, or is refused.

Four layouts: one process, DDP on 2 ranks, FSDP2 with a full state dict and FSDP2 with a
sharded one (torch.distributed.checkpoint folders). Each saves after two AdamW steps with two
parameter groups (weights and biases, so a group's parameters are not the model's order); each
checkpoint is loaded into a fresh, differently initialised run of every layout, and the loaded
weights and optimizer state (exp_avg, exp_avg_sq, step, the groups' hyperparameters) must equal
the saving run's bitwise. The saving run's state is read with torch's own state-dict functions,
keyed by parameter name; the 2-rank layouts save and load in one launch, the one-process layout
in the test process before and after it (and FSDP2 on one process, which shards nothing, reads
the 2-rank FSDP2 checkpoints). A checkpoint that does not fit, or was changed after saving, is
refused, naming it, with the live run unchanged.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from accel import CheckpointError
from conftest import launch

COMMON = """
import torch
from torch import nn
from accel import Accelerator, FSDPConfig
from accel.state import AcceleratorState, GradientState

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 6)
        self.down = nn.Linear(6, 4)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

class Net(nn.Module):
    def __init__(self, extra=False):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2 + extra)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

FSDP = {"full": "FULL_STATE_DICT", "sharded": "SHARDED_STATE_DICT"}

def make(layout, seed, extra=False):
    AcceleratorState._reset_state()
    GradientState._reset_state()
    torch.manual_seed(seed)
    model = Net(extra)
    named = list(model.named_parameters())
    opt = torch.optim.AdamW(
        [{"params": [p for n, p in named if n.endswith("weight")], "weight_decay": 0.1},
         {"params": [p for n, p in named if n.endswith("bias")], "lr": 3e-3, "weight_decay": 0.0}],
        lr=1e-2,
    )
    plugin = FSDPConfig(state_dict_type=FSDP[layout]) if layout in FSDP else None
    acc = Accelerator(fsdp_plugin=plugin)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt

def train(acc, model, opt, steps):
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + acc.process_index)
        acc.backward(model(torch.randn(4, 4, generator=g)).square().mean())
        opt.step()
        opt.zero_grad()

def snapshot(acc, model, opt, layout):
    # Weights and optimizer state keyed by parameter name, read the way torch reads each layout.
    inner = opt.optimizer
    if layout in FSDP:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions, get_model_state_dict, get_optimizer_state_dict)
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        osd = get_optimizer_state_dict(model, inner, options=options)
        state, groups = osd.get("state", {}), osd.get("param_groups", [])
    else:
        module = acc.unwrap_model(model)
        names = {id(p): n for n, p in module.named_parameters()}
        flat = [names[id(p)] for g in inner.param_groups for p in g["params"]]
        sd = inner.state_dict()
        weights = module.state_dict()
        state = {flat[i]: s for i, s in sd["state"].items()}
        groups = [{**g, "params": [flat[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {
        "weights": {k: v.detach().cpu().clone() for k, v in weights.items()},
        "state": {n: {k: v.detach().cpu().clone() for k, v in s.items()} for n, s in state.items()},
        "groups": [{k: v for k, v in g.items()} for g in groups],
    }

def assert_same(got, want, case):
    assert want["weights"] and want["state"], case  # a saving run that trained
    assert got["weights"].keys() == want["weights"].keys(), (case, sorted(got["weights"]))
    for k, v in want["weights"].items():
        assert torch.equal(got["weights"][k], v), (case, k)
    assert got["state"].keys() == want["state"].keys(), (case, sorted(got["state"]))
    for n, s in want["state"].items():
        assert sorted(got["state"][n]) == sorted(s) == ["exp_avg", "exp_avg_sq", "step"], (case, n, sorted(got["state"][n]))
        for k, v in s.items():
            assert torch.equal(got["state"][n][k], v), (case, n, k, got["state"][n][k], v)
    # torch's set_optimizer_state_dict hands FSDP2's optimizer its betas as a list: the same numbers.
    plain = lambda groups: [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups]
    assert plain(got["groups"]) == plain(want["groups"]), (case, got["groups"], want["groups"])
"""
_common: dict = {}
exec(COMMON, _common)
make, train, snapshot, assert_same = (_common[n] for n in ("make", "train", "snapshot", "assert_same"))

WORKER = (
    COMMON
    + """
import sys
from pathlib import Path

out = Path(sys.argv[1])
for layout in ("ddp", "full", "sharded"):
    acc, model, opt = make(layout, seed=0)
    train(acc, model, opt, 2)
    acc.save_state(out / layout)
    reference = snapshot(acc, model, opt, layout)
    if acc.is_main_process:
        torch.save(reference, out / f"{layout}.ref.pt")
acc.wait_for_everyone()
for source in ("one", "ddp", "full", "sharded"):
    want = torch.load(out / f"{source}.ref.pt")
    for layout in ("ddp", "full", "sharded"):
        acc, model, opt = make(layout, seed=1)
        acc.load_state(out / source)
        got = snapshot(acc, model, opt, layout)
        if acc.is_main_process:
            assert_same(got, want, f"{source} -> {layout}")
        train(acc, model, opt, 1)  # the loaded state steps on

# FSDP2 reads a DDP checkpoint's files itself: they are verified against their SHA-256 all the same.
import shutil
from accel import CheckpointError
if acc.is_main_process:
    shutil.copytree(out / "ddp", out / "changed")
    changed = torch.load(out / "changed" / "optimizer.bin")
    changed["param_groups"][0]["lr"] = 0.5
    torch.save(changed, out / "changed" / "optimizer.bin")
acc.wait_for_everyone()
acc, model, opt = make("full", seed=1)
try:
    acc.load_state(out / "changed")
    raise AssertionError("a changed optimizer.bin loaded")
except CheckpointError as exc:
    assert "optimizer.bin does not match the XXH3-128 hash" in str(exc), exc
assert not opt.optimizer.state and opt.optimizer.param_groups[0]["lr"] == 1e-2
acc.print("CROSS OK")
"""
)


def _forge_foreign_strategy(source: Path, target: Path) -> None:
    """`source`, as if a strategy had written its models and optimizers its own way into `engine_0/`."""
    shutil.copytree(source, target)
    (target / "engine_0").mkdir()
    (target / "engine_0" / "states.bin").write_bytes(b"engine states")
    manifest = json.loads((target / "accel_checkpoint.json").read_text())
    manifest["strategy_files"] = ["engine_0"]
    manifest["files"].append("engine_0")
    manifest["sha256"]["engine_0/states.bin"] = hashlib.sha256(b"engine states").hexdigest()
    (target / "accel_checkpoint.json").write_text(json.dumps(manifest))


def test_every_layout_loads_into_every_layout(write_script, tmp_path: Path) -> None:
    acc, model, opt = make("one", seed=0)
    train(acc, model, opt, 2)
    acc.save_state(tmp_path / "one")
    torch.save(snapshot(acc, model, opt, "one"), tmp_path / "one.ref.pt")

    proc = launch(write_script(WORKER), str(tmp_path), timeout=240)
    assert "CROSS OK" in proc.stdout
    assert (tmp_path / "sharded" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (tmp_path / "sharded" / "optimizer_0" / ".metadata").is_file()
    assert (tmp_path / "full" / "model.safetensors").is_file() and not (tmp_path / "full" / "optimizer_0").exists()

    for source in ("one", "ddp", "full", "sharded"):
        acc, model, opt = make("one", seed=1)
        acc.load_state(tmp_path / source)
        assert_same(snapshot(acc, model, opt, "one"), torch.load(tmp_path / f"{source}.ref.pt"), f"{source} -> one")
        train(acc, model, opt, 1)

    # FSDP2 on one process shards nothing: its loader reads a sharded checkpoint of 2 ranks whole.
    for source in ("full", "sharded"):
        acc, model, opt = make("sharded", seed=1)
        acc.load_state(tmp_path / source)
        want = torch.load(tmp_path / f"{source}.ref.pt")
        assert_same(snapshot(acc, model, opt, "one"), want, f"{source} -> FSDP2 on one process")

    # A model the sharded checkpoint does not fit: refused, naming its folder, nothing loaded.
    acc, model, opt = make("one", seed=1, extra=True)
    before = snapshot(acc, model, opt, "one")
    with pytest.raises(CheckpointError, match=r"pytorch_model_fsdp_0.*does not fit the model") as info:
        acc.load_state(tmp_path / "sharded")
    assert "\n" not in str(info.value)
    assert_unchanged(snapshot(acc, model, opt, "one"), before)

    # Files another strategy wrote its own way (an engine's): refused, not skipped.
    _forge_foreign_strategy(tmp_path / "one", tmp_path / "foreign")
    acc, model, opt = make("one", seed=1)
    before = snapshot(acc, model, opt, "one")
    with pytest.raises(
        CheckpointError, match=r"wrote its own way \(engine_0\), which this run.s DDPStrategy cannot read"
    ) as info:
        acc.load_state(tmp_path / "foreign")
    assert "\n" not in str(info.value)
    assert_unchanged(snapshot(acc, model, opt, "one"), before)


def assert_unchanged(got: dict, before: dict) -> None:
    assert got["state"] == {} == before["state"]
    assert all(torch.equal(got["weights"][k], v) for k, v in before["weights"].items())
