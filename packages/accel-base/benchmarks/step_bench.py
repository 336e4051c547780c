"""Worker for `nox -s bench`: step time of raw DDP and of accel, interleaved in one process group.

Launched by run.py through `accel launch --num-processes 2`. Every variant trains a copy of
the same MLP on the same batch with the same optimizer and `zero_grad(set_to_none=True)`.
"Same settings" is DDP built from exactly the keyword arguments accel passes
(`DistributedDataParallelKwargs().ddp_kwargs()`), checked against accel's wrapped model.
Rounds alternate between variants and rotate their order, so drift in machine load and the
position in a round hit all variants alike; ratios are also taken per round (paired) and
reported as median and range. Python calls per step are counted with cProfile, a figure
that machine load does not move. Rank 0 writes the results to the JSON file given.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import pstats
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from accel import Accelerator, DistributedDataParallelKwargs
from accel.distributed import watchdog
from torch.nn.parallel import DistributedDataParallel as DDP

# What must match between accel's DDP and the raw one for the comparison to be about accel.
DDP_SETTINGS = (
    "gradient_as_bucket_view",
    "bucket_bytes_cap",
    "bucket_bytes_cap_default",
    "find_unused_parameters",
    "static_graph",
    "broadcast_buffers",
)


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


def raw_step_keep_grads(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def make_accel_step(accelerator: Accelerator, set_to_none: bool = True):
    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)

    return step


def raw_step_reduce(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    dist.all_reduce(loss.detach().clone())  # the loss summed over ranks for logging, as a script would


def make_accel_step_reduce(accelerator: Accelerator, watched: bool):
    """accel's step plus `accelerator.reduce(loss)`; with `watched` False the collective watchdog is switched off
    around it, so the pair measures the watchdog alone."""

    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if watched:
            accelerator.reduce(loss.detach())
            return
        dog, watchdog._dog = watchdog._dog, None
        try:
            accelerator.reduce(loss.detach())
        finally:
            watchdog._dog = dog

    return step


def ddp_settings(model: DDP) -> dict[str, Any]:
    return {name: getattr(model, name, None) for name in DDP_SETTINGS}


def build_variants(
    accelerator: Accelerator,
    base: torch.nn.Module,
    keep_grads: bool,
    explicit_bucket: bool,
    diagnose: bool = False,
    with_reduce: bool = False,
) -> dict[str, tuple[Any, ...]]:
    def sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=1e-3)

    naive = DDP(copy.deepcopy(base))
    same = DDP(copy.deepcopy(base), **DistributedDataParallelKwargs().ddp_kwargs())
    ours_model = copy.deepcopy(base)
    ours_model, ours_opt = accelerator.prepare(ours_model, sgd(ours_model))
    if ddp_settings(ours_model) != ddp_settings(same):
        raise RuntimeError(f"accel's DDP {ddp_settings(ours_model)} differs from the raw one {ddp_settings(same)}")
    variants: dict[str, tuple[Any, ...]] = {
        "raw_ddp_default": (naive, sgd(naive), raw_step),
        "raw_ddp_same_settings": (same, sgd(same), raw_step),
        "accel": (ours_model, ours_opt, make_accel_step(accelerator)),
    }
    if keep_grads:  # zero_grad(set_to_none=False): gradients stay views of DDP's buckets
        same_kg = DDP(copy.deepcopy(base), **DistributedDataParallelKwargs().ddp_kwargs())
        kg_model = copy.deepcopy(base)
        kg_model, kg_opt = accelerator.prepare(kg_model, sgd(kg_model))
        variants["raw_ddp_same_settings_keep_grads"] = (same_kg, sgd(same_kg), raw_step_keep_grads)
        variants["accel_keep_grads"] = (kg_model, kg_opt, make_accel_step(accelerator, set_to_none=False))
    if with_reduce:  # a collective through accel every step: what the stuck-collective watchdog costs
        if watchdog._dog is None:
            raise RuntimeError("the collective watchdog is off (ACCEL_COLLECTIVE_WARN_SECONDS=0?): nothing to measure")
        raw_r = DDP(copy.deepcopy(base), **DistributedDataParallelKwargs().ddp_kwargs())
        variants["raw_ddp_same_settings_reduce"] = (raw_r, sgd(raw_r), raw_step_reduce)
        for name, on in (("accel_reduce", True), ("accel_reduce_unwatched", False)):
            m = copy.deepcopy(base)
            m, o = accelerator.prepare(m, sgd(m))
            variants[name] = (m, o, make_accel_step_reduce(accelerator, on))
    if diagnose:  # accel's prepared model and inner optimizer driven by the raw loop: objects vs. calls
        dm = copy.deepcopy(base)
        dm, dopt = accelerator.prepare(dm, sgd(dm))
        variants["accel_objects_raw_loop"] = (dm, dopt.optimizer, raw_step)
    if explicit_bucket:  # what accel passed before: bucket_cap_mb=25 spelled out (first bucket 25 MB, not 1 MB)
        explicit = DDP(copy.deepcopy(base), gradient_as_bucket_view=True, bucket_cap_mb=25)
        variants["raw_ddp_explicit_25mb"] = (explicit, sgd(explicit), raw_step)
    return variants


def python_calls_per_step(variant: tuple[Any, ...], x: torch.Tensor, y: torch.Tensor, steps: int = 5) -> float:
    """Python-level function calls (incl. C functions called from Python) per step."""
    model, opt, step = variant
    dist.barrier()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step(model, opt, x, y)
    prof.disable()
    return pstats.Stats(prof).total_calls / steps  # type: ignore[attr-defined,no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="64,512,2048")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--keep-grads", action="store_true", help="also time zero_grad(set_to_none=False)")
    parser.add_argument("--diagnose", action="store_true", help="also time accel's objects in the raw loop")
    parser.add_argument(
        "--reduce", action="store_true", help="also time a step with a reduce through accel, watchdog on and off"
    )
    parser.add_argument("--explicit-bucket", action="store_true", help="also time DDP with bucket_cap_mb=25 passed")
    args = parser.parse_args()

    accelerator = Accelerator()
    results: dict[str, Any] = {}
    for hidden in (int(s) for s in args.sizes.split(",")):
        base = mlp(hidden)
        g = torch.Generator().manual_seed(accelerator.process_index)
        x = torch.randn(args.batch, hidden, generator=g)
        y = torch.randn(args.batch, 1, generator=g)
        variants = build_variants(accelerator, base, args.keep_grads, args.explicit_bucket, args.diagnose, args.reduce)
        names = list(variants)
        times: dict[str, list[float]] = {name: [] for name in names}
        per_round: dict[str, list[float]] = {name: [] for name in names}
        for model, opt, step in variants.values():
            for _ in range(args.warmup):
                step(model, opt, x, y)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order each round
                model, opt, step = variants[name]
                dist.barrier()
                block = []
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step(model, opt, x, y)
                    block.append(time.perf_counter() - t0)
                times[name].extend(block)
                per_round[name].append(statistics.median(block))
        calls = {name: python_calls_per_step(variants[name], x, y) for name in names}
        ratios = {
            f"{ours}/{raw}": sorted(a / b for a, b in zip(per_round[ours], per_round[raw], strict=True))
            for ours, raw in (
                ("accel", "raw_ddp_default"),
                ("accel", "raw_ddp_same_settings"),
                ("raw_ddp_same_settings", "raw_ddp_default"),
                ("accel_keep_grads", "raw_ddp_same_settings_keep_grads"),
                ("raw_ddp_same_settings_keep_grads", "raw_ddp_same_settings"),
                ("raw_ddp_explicit_25mb", "raw_ddp_same_settings"),
                ("accel_objects_raw_loop", "raw_ddp_same_settings"),
                ("accel", "accel_objects_raw_loop"),
                ("accel_reduce", "raw_ddp_same_settings_reduce"),
                ("accel_reduce", "accel_reduce_unwatched"),
            )
            if ours in per_round and raw in per_round
        }
        results[str(hidden)] = {
            **{name: statistics.median(ts) for name, ts in times.items()},
            "paired_round_ratios": ratios,
            "python_calls_per_step": calls,
            "ddp_settings": {k: str(v) for k, v in ddp_settings(variants["accel"][0]).items()},
        }
    if accelerator.is_main_process:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
