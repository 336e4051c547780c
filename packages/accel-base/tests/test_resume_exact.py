"""Exact mid-epoch resume under DDP and FSDP2, in a fresh process group.

Train 3 epochs on 2 processes (shuffling, dropout with a different RNG stream per rank
and python/numpy random numbers in the loss,
AdamW, an LR scheduler, an uneven dataset so the last round is padded), saving mid-epoch
in epoch 0 and in epoch 1. Then, in new processes, load each checkpoint and train to the
same end, the way Accelerate documents (`skip_first_batches` over the resumed epoch) or with
`DataLoaderConfiguration(use_stateful_dataloader=True)` (iteration simply continues): each
configuration resumes from both checkpoints, one each way, and each checkpoint is resumed
both ways over the configurations. The final weights must be bitwise equal to the
uninterrupted run's, and so must every later step's loss on every rank. Both shuffling
modes: the default (Accelerate's: a sampler generator synchronised from rank 0 at
every epoch, worker seeds from the global generator) and `use_seedable_sampler=True`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import launch
from safetensors.torch import load_file

SCRIPT = """
import json, random, sys
from pathlib import Path
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator, DataLoaderConfiguration, set_seed

mode, out, approach, save_steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], [int(s) for s in sys.argv[4].split(",")]
strategy, seedable = sys.argv[5], sys.argv[6] == "seedable"
EPOCHS = 3

class Step:
    # The training step counter, saved with the checkpoint like any user object.
    def __init__(self):
        self.value = 0
    def state_dict(self):
        return {"value": self.value}
    def load_state_dict(self, state):
        self.value = int(state["value"])

set_seed(0)
g = torch.Generator().manual_seed(1)
features, targets = torch.randn(44, 6, generator=g), torch.randint(0, 3, (44,), generator=g)
acc = Accelerator(
    strategy=strategy,
    dataloader_config=DataLoaderConfiguration(
        use_stateful_dataloader=approach == "stateful", use_seedable_sampler=seedable
    ),
)
model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3))
opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
loader = DataLoader(TensorDataset(features, targets), batch_size=4, shuffle=True)
model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
step = Step()
acc.register_for_checkpointing(step)
# A different dropout stream per rank: a resume that re-synchronised the ranks' RNG would show.
torch.manual_seed(100 + acc.process_index)
random.seed(200 + acc.process_index)
np.random.seed(300 + acc.process_index)

per_epoch = len(loader)
start_epoch, skip = 0, 0
if mode == "resume":
    acc.load_state(out / f"ckpt_{save_steps[0]}")
    start_epoch, skip = divmod(step.value, per_epoch)
    assert loader.epoch == start_epoch, (loader.epoch, start_epoch)

losses = {}
if mode == "run" and 0 in save_steps:
    acc.save_state(out / "ckpt_0")  # before the first batch
for epoch in range(start_epoch, EPOCHS):
    batches = loader
    if epoch == start_epoch and skip and approach == "skip":
        batches = acc.skip_first_batches(loader, skip)
    for x, y in batches:
        # Python's and numpy's RNG feed the loss too, so they must come back per rank as well.
        noise = 1 + 1e-2 * (random.random() + float(np.random.rand()))
        loss = F.cross_entropy(model(x), y) * noise
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step.value += 1
        losses[step.value] = loss.item()
        if mode == "run" and step.value in save_steps:
            acc.save_state(out / f"ckpt_{step.value}")
assert step.value == EPOCHS * per_epoch, (step.value, per_epoch)
tag = "run" if mode == "run" else f"{approach}_{save_steps[0]}"
acc.save_model(model, out / f"final_{tag}")
(out / f"losses_{tag}_rank{acc.process_index}.json").write_text(json.dumps(losses))
acc.print(f"{tag}: {per_epoch} batches per epoch", flush=True)
"""

SAVE_STEPS = (3, 8)  # 6 batches per epoch: epoch 0 after 3, epoch 1 after 2
BOUNDARIES = (0, 6, 18)  # before the first batch, the end of epoch 0 (an epoch boundary), after the last batch
# One uninterrupted run per configuration, saving at every step a test resumes from (the DDP run also at the
# boundaries).
RUNS = {("ddp", "default"): SAVE_STEPS + BOUNDARIES, ("fsdp2", "default"): SAVE_STEPS, ("ddp", "seedable"): SAVE_STEPS}
# Each configuration resumes from both save steps, each step once per approach over the configurations.
RESUMES = [
    ("ddp", "default", 3, "skip"),
    ("ddp", "default", 8, "stateful"),
    ("fsdp2", "default", 3, "stateful"),
    ("fsdp2", "default", 8, "skip"),
    ("ddp", "seedable", 3, "stateful"),
    ("ddp", "seedable", 8, "skip"),
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """The folder of a configuration's uninterrupted run (launched once, when a test first asks for it)."""
    runs: dict[tuple[str, str], Path] = {}

    def run(strategy: str, sampler: str) -> Path:
        if (strategy, sampler) not in runs:
            out = tmp_path_factory.mktemp(f"resume_{strategy}_{sampler}")
            (out / "train.py").write_text(SCRIPT)
            steps = ",".join(map(str, sorted(RUNS[strategy, sampler])))
            proc = launch(out / "train.py", "run", str(out), "skip", steps, strategy, sampler, timeout=300)
            assert "run: 6 batches per epoch" in proc.stdout
            runs[strategy, sampler] = out
        return runs[strategy, sampler]

    return run


@pytest.mark.parametrize(("strategy", "sampler", "save_at", "approach"), RESUMES)
def test_resume_in_fresh_processes_is_bitwise_exact(
    uninterrupted: Callable[[str, str], Path], strategy: str, sampler: str, save_at: int, approach: str
) -> None:
    out = uninterrupted(strategy, sampler)
    launch(out / "train.py", "resume", str(out), approach, str(save_at), strategy, sampler, timeout=300)
    reference = load_file(str(out / "final_run" / "model.safetensors"))
    resumed = load_file(str(out / f"final_{approach}_{save_at}" / "model.safetensors"))
    checkpoint = load_file(str(out / f"ckpt_{save_at}" / "model.safetensors"))
    assert set(resumed) == set(reference)
    for name, value in reference.items():
        assert not torch.equal(value, checkpoint[name]), f"{name}: training after the checkpoint changed nothing"
        assert torch.equal(resumed[name], value), (name, (resumed[name] - value).abs().max())
    for rank in (0, 1):
        ref_losses = json.loads((out / f"losses_run_rank{rank}.json").read_text())
        got = json.loads((out / f"losses_{approach}_{save_at}_rank{rank}.json").read_text())
        assert got == {k: v for k, v in ref_losses.items() if int(k) > save_at}, rank


@pytest.mark.parametrize("save_at", BOUNDARIES)
def test_resume_at_an_epoch_boundary_is_bitwise_exact(uninterrupted: Callable[[str, str], Path], save_at: int) -> None:
    """A checkpoint saved when no batch of the epoch has been drawn yet resumes exactly: the sampler's
    generator (synchronised across ranks, moved on by each epoch's shuffle) is saved with the loader."""
    out = uninterrupted("ddp", "default")
    positions = json.loads((out / f"ckpt_{save_at}" / "dataloaders.json").read_text())
    assert positions[0]["batches_yielded"] == 0 and positions[0]["epoch"] == save_at // 6
    assert set(positions[0].get("epoch_rng", {})) == {"generator"}
    launch(out / "train.py", "resume", str(out), "skip", str(save_at), "ddp", "default", timeout=300)
    reference = load_file(str(out / "final_run" / "model.safetensors"))
    resumed = load_file(str(out / f"final_skip_{save_at}" / "model.safetensors"))
    assert set(resumed) == set(reference)
    for name, value in reference.items():
        assert torch.equal(resumed[name], value), (name, (resumed[name] - value).abs().max())
    for rank in (0, 1):
        ref_losses = json.loads((out / f"losses_run_rank{rank}.json").read_text())
        got = json.loads((out / f"losses_skip_{save_at}_rank{rank}.json").read_text())
        assert got == {k: v for k, v in ref_losses.items() if int(k) > save_at}, rank
