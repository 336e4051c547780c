"""DeepSpeed step overhead: accel's DeepSpeed strategy against raw DDP, same MLP, same batch.

    DS_ACCELERATOR=cpu accel launch --num-processes 2 packages/accel-base/benchmarks/deepspeed_bench.py \
        --out ds.json [--sizes 64,512 --stages 0,2,3 --rounds 10 --steps 10]

Needs `accel-base[deepspeed]`. Every variant trains a copy of the same MLP with SGD; rounds
alternate between variants so drift in machine load hits all alike. Rank 0 writes the
median step times to `--out` and prints a markdown table of the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
import torch.distributed as dist
from accel import Accelerator, DeepSpeedPlugin
from accel.state import AcceleratorState, GradientState
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
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def deepspeed_variant(base: torch.nn.Module, stage: int, batch: int) -> tuple[torch.nn.Module, object, object]:
    """A model prepared by its own Accelerator with DeepSpeed at `stage` (the states are reset first)."""
    AcceleratorState._reset_state()
    GradientState._reset_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage))
    model = copy.deepcopy(base)
    loader = torch.utils.data.DataLoader(list(range(batch * accelerator.num_processes)), batch_size=batch)
    model, opt, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3), loader)

    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()

    return model, opt, step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="64,512")
    parser.add_argument("--stages", default="0,2,3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    Accelerator()  # the process group, shared by every variant
    rank = dist.get_rank()
    results: dict[str, dict[str, float]] = {}
    for hidden in (int(s) for s in args.sizes.split(",")):
        base = mlp(hidden)
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(args.batch, hidden, generator=g), torch.randn(args.batch, 1, generator=g)
        ddp = DDP(copy.deepcopy(base), gradient_as_bucket_view=True)
        variants = {"raw_ddp": (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3), raw_step)}
        for stage in (int(s) for s in args.stages.split(",")):
            variants[f"zero{stage}"] = deepspeed_variant(base, stage, args.batch)  # type: ignore[assignment]
        times: dict[str, list[float]] = {name: [] for name in variants}
        for model, opt, step in variants.values():  # warm-up
            for _ in range(3):
                step(model, opt, x, y)  # type: ignore[operator]
        for _ in range(args.rounds):
            for name, (model, opt, step) in variants.items():
                dist.barrier()
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step(model, opt, x, y)  # type: ignore[operator]
                    times[name].append(time.perf_counter() - t0)
        results[str(hidden)] = {name: statistics.median(ts) for name, ts in times.items()}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print("\n## DeepSpeed step time, 2 gloo processes (median ms per step; ratio to raw DDP)\n")
        names = [n for n in next(iter(results.values())) if n != "raw_ddp"]
        print("| hidden | raw DDP | " + " | ".join(f"accel {n}" for n in names) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
        for hidden, m in results.items():
            cells = [f"{m[n] * 1e3:.3f} ({m[n] / m['raw_ddp']:.2f}x)" for n in names]
            print(f"| {hidden} | {m['raw_ddp'] * 1e3:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
