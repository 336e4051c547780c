"""An FSDP2 checkpoint in Accelerate's layout, written by Accelerate's own code, resumed under Accelerate and accel.

    python resume_fsdp_from_accelerate.py save CKPT_DIR OUT_FILE full|sharded      (real Accelerate)
    python resume_fsdp_from_accelerate.py resume CKPT_DIR OUT_FILE full|sharded    (real Accelerate)
    python resume_fsdp_from_accelerate.py accel CKPT_DIR OUT_FILE full|sharded     (accel)

Accelerate 1.15 enables FSDP only on accelerator devices, so on CPUs `Accelerator.save_state` never takes
its FSDP branch. `save` therefore shards the model with torch's `fully_shard`, marks the state as FSDP2
after `prepare` (so that Accelerate's FSDP functions behave as in an FSDP2 run), and runs that branch's
steps itself, with Accelerate's functions: `save_fsdp_model` and `save_fsdp_optimizer` (FSDP2, the
plugin's state dict type), then `save_accelerator_state` for the scheduler and each rank's random
states, as `save_state` does under FSDP. `resume` reads them back with `load_fsdp_model`,
`load_fsdp_optimizer` and `load_accelerator_state`; `accel` prepares the same model with accel's
FSDP2 and calls `load_state`. Both then train 6 steps; rank 0 writes the losses and the full weights.
"""

import os
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F

mode, ckpt, out, kind = sys.argv[1:5]
state_dict_type = "SHARDED_STATE_DICT" if kind == "sharded" else "FULL_STATE_DICT"

torch.manual_seed(3)
g = torch.Generator().manual_seed(11)
features = torch.randn(96, 8, generator=g)
targets = features @ torch.randn(8, 2, generator=g)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 2))

if mode == "accel":
    from accel import Accelerator, FSDPConfig

    accelerator = Accelerator(fsdp_plugin=FSDPConfig(state_dict_type=state_dict_type))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.load_state(ckpt)
else:
    from accelerate import Accelerator
    from accelerate.checkpointing import load_accelerator_state, save_accelerator_state
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer
    from torch.distributed.fsdp import fully_shard

    accelerator = Accelerator()  # MULTI_CPU: the model is sharded here, not by prepare
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=state_dict_type)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-2, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    # Prepared as under Accelerate's FSDP (the scheduler then steps once per process, as Accelerate's does).
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    # From here Accelerate's FSDP functions see the FSDP2 run they were written for (`is_fsdp2`: with a full
    # state dict, rank 0 reads the file and broadcasts it).
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    if mode == "resume":
        load_fsdp_model(plugin, accelerator, model, ckpt, 0)
        load_fsdp_optimizer(plugin, accelerator, optimizer.optimizer, model, ckpt, 0)
        load_accelerator_state(ckpt, [], [], [scheduler], [], accelerator.process_index)

rank, world = accelerator.process_index, accelerator.num_processes
losses = []
steps = 5 if mode == "save" else 6
for step in range(steps):
    start = (step * world + rank) * 4
    x, y = features[start : start + 4], targets[start : start + 4]
    x = x + float(np.random.rand()) * 0.1 + random.random() * 0.1 + 0.05 * torch.randn_like(x)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    losses.append(loss.item())

if mode == "save":
    save_fsdp_model(plugin, accelerator, model, ckpt, 0)
    save_fsdp_optimizer(plugin, accelerator, optimizer.optimizer, model, ckpt, 0)
    save_accelerator_state(ckpt, [], [], [scheduler], [], accelerator.process_index, 5)
accelerator.wait_for_everyone()

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402

weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
if rank == 0:
    partial = out + ".partial"
    torch.save({"losses": losses, "weights": {k: v.float() for k, v in weights.items()}}, partial)
    os.replace(partial, out)
