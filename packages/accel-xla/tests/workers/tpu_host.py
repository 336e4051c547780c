"""A torch_xla.launch-style script (the shape `accelerate launch --tpu` users write: a main function
given to torch_xla's launcher) run by `accel launch`. Prints one JSON line from each worker: the
environment torch_xla reads, the index torch_xla.launch passed, the accel state, one training step."""

import json
import os

import torch
import torch_xla
from accel import Accelerator


def _mp_fn(index: int) -> None:
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.ones(2, 4, device=accelerator.device)
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    env = {k: os.environ.get(k) for k in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "XLA_USE_SPMD", "ACCEL_STRATEGY")}
    info = {
        "index": index,
        "env": env,
        "adapter": accelerator.state.adapter.name,
        "device": str(accelerator.device),
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "strategy": accelerator.strategy.name,
        "mixed_precision": accelerator.mixed_precision,
        "loss": float(loss),
    }
    print("WORKER " + json.dumps(info), flush=True)


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=())
