"""accel's `save_fsdp_model`/`save_fsdp_optimizer`/`load_fsdp_*` against Accelerate 1.15's, file for file.

    torchrun --nproc_per_node=2 fsdp_checkpoint_files.py OUT_DIR

A small model and its Adam optimizer are sharded with accel's FSDP2 and trained two steps. For each
state_dict_type (FULL, SHARDED; SHARDED also with `use_dcp=False`), accel's functions and the real Accelerate's (given an FSDP2 plugin of
its own kind) each save the model and the optimizer; both must write the same file names. Then a fresh,
differently initialised model loads Accelerate's files with accel's loaders, and another loads accel's
files with Accelerate's loaders: both end with the trained weights and optimizer state exactly. Any
difference raises; rank 0 writes OUT_DIR/ok when everything matched.
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import accel
import accelerate
import torch
from accel.utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
from accelerate.utils import fsdp_utils as reference
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
from torch.distributed.fsdp.fully_sharded_data_parallel import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
)

out = Path(sys.argv[1])
accelerator = accel.Accelerator(fsdp_plugin=accel.FullyShardedDataParallelPlugin())
accelerate.PartialState()  # Accelerate's logger needs its state; it joins accel's process group


def prepared(seed: int) -> tuple:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-2))


def full(model, optimizer) -> tuple[dict, dict]:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return accelerator.get_state_dict(model), get_optimizer_state_dict(model, optimizer.optimizer, options=options)


def same(got: object, want: object, where: str) -> None:
    if isinstance(want, torch.Tensor):
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (where, sorted(got), sorted(want))
        for key in want:
            same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):  # a tuple hyperparameter (Adam's betas) may come back as a list
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            same(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


model, optimizer = prepared(0)
torch.manual_seed(accelerator.process_index)
for _ in range(2):
    accelerator.backward(model(torch.randn(4, 6)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
trained = full(model, optimizer)

for kind, use_dcp in (("FULL_STATE_DICT", True), ("SHARDED_STATE_DICT", True), ("SHARDED_STATE_DICT", False)):
    accelerator.state.fsdp_plugin.set_state_dict_type(kind)
    sharded = kind == "SHARDED_STATE_DICT"
    dcp = {"use_dcp": use_dcp}
    theirs = SimpleNamespace(
        fsdp_version=2,
        state_dict_type=StateDictType[kind],
        state_dict_config=ShardedStateDictConfig() if sharded else FullStateDictConfig(True, True),
        optim_state_dict_config=ShardedOptimStateDictConfig() if sharded else FullOptimStateDictConfig(True, True),
    )
    case = kind if use_dcp else f"{kind}-per-rank"
    ours, ref = out / case / "accel", out / case / "accelerate"
    save_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model, ours, **dcp)
    save_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer, model, ours, **dcp)
    reference.save_fsdp_model(theirs, accelerator, model, ref, **dcp)
    reference.save_fsdp_optimizer(theirs, accelerator, optimizer, model, ref, **dcp)
    accelerator.wait_for_everyone()
    names = sorted(p.relative_to(ours).as_posix() for p in ours.rglob("*"))
    assert names == sorted(p.relative_to(ref).as_posix() for p in ref.rglob("*")), (kind, names)

    # Accelerate's files, read by accel's loaders.
    model2, optimizer2 = prepared(1)
    load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, model2, ref, **dcp)
    load_fsdp_optimizer(accelerator.state.fsdp_plugin, accelerator, optimizer2, model2, ref, **dcp)
    got = full(model2, optimizer2)
    # accel's files, read by Accelerate's loaders.
    model3, optimizer3 = prepared(2)
    reference.load_fsdp_model(theirs, accelerator, model3, ours, **dcp)
    reference.load_fsdp_optimizer(theirs, accelerator, optimizer3, model3, ours, **dcp)
    got_back = full(model3, optimizer3)
    if accelerator.is_main_process:
        same(got, trained, f"{case}: Accelerate's files loaded by accel")
        same(got_back, trained, f"{case}: accel's files loaded by Accelerate")
        print(case, names)

if accelerator.is_main_process:
    (out / "ok").write_text("ok")
accelerator.end_training()
