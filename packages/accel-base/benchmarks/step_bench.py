"""Worker for `nox -s bench`: step time of raw DDP and of accel, interleaved in one process group.

Launched by run.py through `accel launch --num-processes 2`. Every variant trains a copy of
the same MLP on the same batch; rounds alternate between variants so drift in machine load
hits all of them alike. Rank 0 writes the per-step times to the JSON file given.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.distributed as dist
from accel import Accelerator
from torch.nn.parallel import DistributedDataParallel as DDP


def mlp(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )


def raw_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def make_accel_step(accelerator: Accelerator):
    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="64,512,2048")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    accelerator = Accelerator()
    results: dict[str, dict[str, float]] = {}
    for hidden in (int(s) for s in args.sizes.split(",")):
        base = mlp(hidden)
        g = torch.Generator().manual_seed(accelerator.process_index)
        x = torch.randn(args.batch, hidden, generator=g)
        y = torch.randn(args.batch, 1, generator=g)

        naive = DDP(copy.deepcopy(base))
        same = DDP(copy.deepcopy(base), gradient_as_bucket_view=True)
        ours_model = copy.deepcopy(base)
        ours_opt = torch.optim.SGD(ours_model.parameters(), lr=1e-3)
        ours_model, ours_opt = accelerator.prepare(ours_model, ours_opt)
        variants = {
            "raw_ddp_default": (naive, torch.optim.SGD(naive.parameters(), lr=1e-3), raw_step),
            "raw_ddp_same_settings": (same, torch.optim.SGD(same.parameters(), lr=1e-3), raw_step),
            "accel": (ours_model, ours_opt, make_accel_step(accelerator)),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for model, opt, step in variants.values():  # warm-up
            for _ in range(3):
                step(model, opt, x, y)
        for _ in range(args.rounds):
            for name, (model, opt, step) in variants.items():
                dist.barrier()
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step(model, opt, x, y)
                    times[name].append(time.perf_counter() - t0)
        medians = {name: statistics.median(ts) for name, ts in times.items()}
        results[str(hidden)] = medians
    if accelerator.is_main_process:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
