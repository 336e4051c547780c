"""A failed `load_state` on 2 gloo processes: every rank raises, naming the file, and no rank's live state changed.

- DDP: a random-state file of one rank that does not hold random states, and a registered
  object that refuses its state on one rank only (the other rank must roll back too).
- FSDP2, full and sharded checkpoints: a model tensor or optimizer state of the wrong shape,
  and a shard file damaged on one rank (torch.distributed.checkpoint reads in place, so the
  other rank's shards would be half-loaded). The live shards and optimizer state are
  compared bitwise, per rank, before and after.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import launch

COMMON = """
import hashlib, json, sys
from pathlib import Path
import torch
from accel import Accelerator
from accel.errors import CheckpointError

out = Path(sys.argv[1])

def local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

def snapshot():
    inner = getattr(opt, "optimizer", opt)
    return {
        "model": {k: local(v) for k, v in model.state_dict().items()},
        "opt": {(i, k): local(v) if isinstance(v, torch.Tensor) else v
                for i, s in enumerate(inner.state.values()) for k, v in s.items()},
        "lr": [g["lr"] for g in inner.param_groups],
        "rng": torch.get_rng_state(),
        **extra_snapshot(),
    }

def same(a, b):
    return a.keys() == b.keys() and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k] for k in x)
        if isinstance(x, dict) else (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y)
        for x, y in ((a[k], b[k]) for k in a)
    )

def forge(directory, prefix):
    # Record the damaged files' hashes, as if they had been saved that way.
    manifest = json.loads((directory / "accel_checkpoint.json").read_text())
    hashes = {k: v for k, v in manifest["sha256"].items() if not k.startswith(prefix)}
    for path in sorted(directory.rglob("*")):
        name = path.relative_to(directory).as_posix()
        if path.is_file() and name.startswith(prefix):
            hashes[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest["sha256"] = hashes
    (directory / "accel_checkpoint.json").write_text(json.dumps(manifest))

def check(case, damage):
    directory = out / case.replace(" ", "_")
    accelerator.save_state(directory)
    saved = snapshot()
    train()  # every live part now differs from the checkpoint
    before = snapshot()
    assert not same(before, saved)
    if accelerator.is_main_process and damage is not None:
        damage(directory)
    accelerator.wait_for_everyone()
    try:
        accelerator.load_state(directory)
        outcome = "loaded"
    except CheckpointError as exc:
        outcome = f"CheckpointError: {exc}"
    after = snapshot()
    verdict = f"restored={same(after, saved)}" if damage is None else f"unchanged={same(after, before)}"
    # One write per line: both ranks share the pipe, and print's separate newline could interleave.
    sys.stdout.write(f"rank {accelerator.process_index} {case}: {outcome} {verdict}\\n")
    sys.stdout.flush()
"""

DDP = (
    COMMON
    + """
class Box:
    def __init__(self):
        self.value, self.refuse = 0, False
    def state_dict(self):
        return {"value": self.value}
    def load_state_dict(self, state):
        if self.refuse:
            self.refuse = False  # once: restoring its own state afterwards works
            raise ValueError("this rank refuses")
        self.value = int(state["value"])

accelerator = Accelerator()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
model, opt, sched = accelerator.prepare(model, opt, sched)
box = Box()
accelerator.register_for_checkpointing(box)

def extra_snapshot():
    return {"sched": dict(sched.state_dict()), "box": box.value}

def train():
    torch.manual_seed(100 + accelerator.process_index)
    accelerator.backward(model(torch.randn(4, 4)).pow(2).mean())
    opt.step(); sched.step(); opt.zero_grad(); box.value += 1

def wrong_rng(directory):
    torch.save({"random_state": 1}, directory / "random_states_1.pt")
    forge(directory, "random_states_1.pt")

train()
check("rng of rank 1 wrong", wrong_rng)
box.refuse = accelerator.process_index == 1
check("object refused on rank 1", lambda directory: None)
check("intact", None)
"""
)

FSDP = (
    COMMON
    + """
import shutil
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from accel import FSDPConfig
from accel.checkpoint.dcp import safe_reader

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(6, 8)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.head = torch.nn.Linear(8, 3)
    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)

accelerator = Accelerator(fsdp_plugin=FSDPConfig(state_dict_type="FULL_STATE_DICT"))
torch.manual_seed(0)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
model, opt = accelerator.prepare(model, opt)

def extra_snapshot():
    return {}

def train():
    g = torch.Generator().manual_seed(7 + accelerator.process_index)
    accelerator.backward(model(torch.randn(4, 6, generator=g)).pow(2).mean())
    opt.step(); opt.zero_grad()

def full_model(directory):
    sd = load_file(str(directory / "model.safetensors"))
    sd["head.weight"] = torch.zeros(5, 8)
    save_file(sd, str(directory / "model.safetensors"))
    forge(directory, "model.safetensors")

def full_optimizer(directory):
    state = torch.load(directory / "optimizer.bin", weights_only=True)
    state["state"]["head.weight"]["exp_avg"] = torch.zeros(5, 8)
    torch.save(state, directory / "optimizer.bin")
    forge(directory, "optimizer.bin")

def rewrite_sharded(directory, folder, prefix, key):
    # The same entries, one of another shape, written as a one-process sharded checkpoint.
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    meta = safe_reader(directory / folder).read_metadata().state_dict_metadata
    flat = {k[len(prefix) + 1:]: torch.zeros(v.size) for k, v in meta.items() if isinstance(v, TensorStorageMetadata)}
    flat[key] = torch.zeros(5, 8)
    shutil.rmtree(directory / folder)
    dcp.save({prefix: flat}, checkpoint_id=str(directory / folder), no_dist=True)
    forge(directory, folder + "/")

def truncate_rank_1_shard(directory):
    shard = directory / "pytorch_model_fsdp_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:40])
    forge(directory, "pytorch_model_fsdp_0/")

train()
check("full model", full_model)
check("full optimizer", full_optimizer)
check("full intact", None)
accelerator.strategy.config.set_state_dict_type("SHARDED_STATE_DICT")
check("sharded model", lambda d: rewrite_sharded(d, "pytorch_model_fsdp_0", "model", "head.weight"))
check("sharded optimizer", lambda d: rewrite_sharded(d, "optimizer_0", "optimizer", "state.head.weight.exp_avg"))
check("sharded shard of rank 1", truncate_rank_1_shard)
check("sharded intact", None)
"""
)


def _outcomes(stdout: str) -> dict[tuple[int, str], str]:
    found = {}
    for line in stdout.splitlines():
        m = re.match(r"rank (\d) ([^:]+): (.*)$", line)
        if m:
            found[(int(m.group(1)), m.group(2))] = m.group(3)
    return found


def _assert_refused(outcomes: dict[tuple[int, str], str], case: str, own: str, other: str | None = None) -> None:
    """Both ranks raised and changed nothing; the failing rank names the file, the others name it too."""
    for rank in (0, 1):
        got = outcomes.get((rank, case), "")
        assert got.startswith("CheckpointError: ") and got.endswith("unchanged=True"), (rank, case, got, outcomes)
        assert re.search(own if other is None or rank == 1 else other, got), (rank, case, got)


def test_ddp_failed_load_changes_nothing_on_any_rank(write_script, tmp_path: Path) -> None:
    proc = launch(write_script(DDP), str(tmp_path), timeout=240)
    outcomes = _outcomes(proc.stdout)
    _assert_refused(
        outcomes,
        "rng of rank 1 wrong",
        r"random_states_1\.pt does not hold random states",
        r"failed on rank 1: CheckpointError: Checkpoint file \S+random_states_1\.pt does not hold random states",
    )
    _assert_refused(
        outcomes,
        "object refused on rank 1",
        r"custom_checkpoint_0\.bin could not be loaded into the registered object \(ValueError: this rank refuses\)",
        r"failed on rank 1: CheckpointError: Checkpoint file \S+custom_checkpoint_0\.bin could not be loaded",
    )
    for rank in (0, 1):
        assert outcomes[(rank, "intact")] == "loaded restored=True", proc.stdout


def test_fsdp2_failed_load_changes_nothing_on_any_rank(write_script, tmp_path: Path) -> None:
    proc = launch(write_script(FSDP), str(tmp_path), timeout=300)
    outcomes = _outcomes(proc.stdout)
    shape = r"does not fit the model \(shape mismatch: head\.weight: saved \(5, 8\), model \(3, 8\)\)"
    _assert_refused(outcomes, "full model", rf"model\.safetensors {shape}")
    _assert_refused(
        outcomes,
        "full optimizer",
        r"optimizer\.bin does not fit the optimizer: state 'exp_avg' of parameter head\.weight has shape \(5, 8\)",
    )
    _assert_refused(outcomes, "sharded model", rf"pytorch_model_fsdp_0/\.metadata {shape}")
    _assert_refused(
        outcomes,
        "sharded optimizer",
        r"optimizer_0 does not fit the optimizer: state 'exp_avg' of 'head\.weight' has shape \(5, 8\)",
    )
    _assert_refused(
        outcomes, "sharded shard of rank 1", r"Sharded checkpoint \S+pytorch_model_fsdp_0 could not be read"
    )
    for rank in (0, 1):
        for case in ("full intact", "sharded intact"):
            assert outcomes[(rank, case)] == "loaded restored=True", (rank, case, proc.stdout)
