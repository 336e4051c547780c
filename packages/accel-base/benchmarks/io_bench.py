"""Worker for `nox -s bench`: checkpoint and data-loader throughput against plain PyTorch.

`checkpoint` (at each of `--sizes` MB of model and AdamW state): `save_state` / `load_state`
against the same files written and read without accel's manifest, hashes and staging (the
model through `safetensors` `save_file`/`load_file` + `load_state_dict`, the optimizer through
`torch.save`/`torch.load` + `load_state_dict`); `load_state` of the same checkpoint without
its recorded digests (what verification costs). Run directly it is one process, and also times
how long `save_state(async_save=True)` blocks the training loop against a synchronous
`save_state`. Under `accel launch --num-processes 2` the model is wrapped in DDP (gloo), rank 0
writes the plain files (accel's writer is rank 0 too), every rank loads, and a variant's time is
rank 0's wall time from a barrier before it to a barrier after it. Each variant's CPU time (this
process, all its threads: hashing included) is recorded beside its wall time. `loader`
(launched on 2 processes): one epoch of a prepared loader (sharded, and with `dispatch_batches`)
against a plain `DataLoader` with `DistributedSampler`, same dataset, batch size and shuffling.
Writes medians to JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accel import Accelerator, DataLoaderConfiguration
from accel.checkpoint.state import MANIFEST
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CHECKPOINT_RATIOS = {
    "save_state / plain save": ("accel_save", "plain_save"),
    "load_state / plain load": ("accel_load", "plain_load"),
    "load_state verified / unverified": ("accel_load", "accel_load_unverified"),
    "save_state(async_save=True) / save_state, time the call blocks training": (
        "async_save_call",
        "sync_save_call",
    ),
    "training step during an async save's write / training step": ("step_during_async_save", "step"),
}
"""Each checkpoint ratio: label -> (accel's timing, the baseline's), as `run.py` prints them."""


def checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    """Paired rounds at each size: accel against the same files written and read without accel."""
    return {
        "sizes": {f"{mb}MB": _checkpoint_size(args, mb) for mb in args.sizes},
        "rounds": args.rounds,
        "processes": dist.get_world_size() if dist.is_initialized() else 1,
    }


def _model(megabytes: int) -> tuple[torch.nn.Module, int]:
    """Linear layers whose weights and two AdamW moments come to about `megabytes` MB."""
    hidden = 1024 if megabytes < 400 else 2048
    per_layer = 3 * 4 * (hidden * hidden + hidden)
    layers = max(1, round(megabytes * 1e6 / per_layer))
    return torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)]), hidden


def _paired(ours: list[float], base: list[float]) -> dict[str, float]:
    """Median, minimum and maximum of the per-round ratios ours / base."""
    ratios = [a / b for a, b in zip(ours, base)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def _shared_directory(args: argparse.Namespace, accelerator: Accelerator) -> Path:
    """A new temporary directory, the same one on every rank (rank 0 makes it)."""
    made = [tempfile.mkdtemp(dir=args.dir) if accelerator.is_main_process else ""]
    if dist.is_initialized():
        dist.broadcast_object_list(made, src=0)
    return Path(made[0])


def _checkpoint_size(args: argparse.Namespace, megabytes: int) -> dict[str, Any]:
    """Each round times every variant once, in an order that rotates round by round, each after
    `os.sync()` (so no variant pays for the dirty pages of the one before); the first `--warmup` rounds
    are dropped. Ratios are medians of the per-round (paired) ratios."""
    import warnings

    from accel.checkpoint import background

    accelerator = Accelerator()
    main = accelerator.is_main_process
    torch.manual_seed(0)
    model, hidden = _model(megabytes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    module = accelerator.unwrap_model(model)  # DDP's state dict keys carry "module."; the plain files do not

    def step() -> None:
        accelerator.backward(model(torch.randn(8, hidden)).sum())
        opt.step()
        opt.zero_grad()

    step()
    nbytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    nbytes += sum(
        v.numel() * v.element_size() for s in opt.state_dict()["state"].values() for v in s.values() if v.ndim
    )
    root = _shared_directory(args, accelerator)
    plain, ours, bare = root / "plain", root / "accel", root / "unverified"
    try:

        def plain_save() -> None:
            if main:  # rank 0 writes, as accel's writer does
                save_file(module.state_dict(), str(plain / "model.safetensors"))
                torch.save(opt.state_dict(), plain / "optimizer.bin")

        def plain_load() -> None:
            module.load_state_dict(load_file(str(plain / "model.safetensors")))
            opt.load_state_dict(torch.load(plain / "optimizer.bin", weights_only=True))

        def async_call() -> Callable[[], Any]:
            accelerator.save_state(root / "async", async_save=True)  # the time it blocks the training loop
            return background.finish  # the rest of the background write, untimed

        def step_during_save() -> Callable[[], Any]:
            step()  # started right after an asynchronous save returned (see `before`), while its files are written
            return background.finish

        variants: dict[str, Callable[[], Any]] = {
            "plain_save": plain_save,
            "accel_save": lambda: accelerator.save_state(ours),
            "plain_load": plain_load,
            "accel_load": lambda: accelerator.load_state(ours),
            "accel_load_unverified": lambda: accelerator.load_state(bare),
        }
        if accelerator.num_processes == 1:
            variants |= {
                "sync_save_call": lambda: accelerator.save_state(root / "sync"),
                "async_save_call": async_call,
                "step": step,
                "step_during_async_save": step_during_save,
            }
        before = {"step_during_async_save": lambda: accelerator.save_state(root / "async", async_save=True)}
        if main:
            plain.mkdir()
        plain_save()
        accelerator.save_state(ours)
        if main:
            _without_hashes(ours, bare)
        accelerator.wait_for_everyone()
        times: dict[str, list[float]] = {name: [] for name in variants}
        cpu: dict[str, list[float]] = {name: [] for name in variants}
        loads: list[float] = []
        names = list(variants)
        for r in range(args.warmup + args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                os.sync()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the unverified load's warning
                    if name in before:
                        before[name]()
                    accelerator.wait_for_everyone()
                    t0, c0 = time.perf_counter(), time.process_time()
                    after = variants[name]()
                    accelerator.wait_for_everyone()
                    elapsed, used = time.perf_counter() - t0, time.process_time() - c0
                    if callable(after):
                        after()
                if r >= args.warmup:
                    times[name].append(elapsed)
                    cpu[name].append(used)
            if r >= args.warmup:
                loads.append(os.getloadavg()[0])
    finally:
        accelerator.wait_for_everyone()
        if main:
            shutil.rmtree(root, ignore_errors=True)
    return {
        "megabytes": nbytes / 1e6,
        "median_seconds": {name: statistics.median(ts) for name, ts in times.items()},
        "median_cpu_seconds": {name: statistics.median(ts) for name, ts in cpu.items()},
        "ratios": {
            label: _paired(times[num], times[den]) | {"of": [num, den]}
            for label, (num, den) in CHECKPOINT_RATIOS.items()
            if num in times
        },
        "load_average_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)},
        "rounds": args.rounds,
        "warmup_rounds_dropped": args.warmup,
    }


def _without_hashes(checkpoint: Path, target: Path) -> Path:
    """A copy of `checkpoint` whose manifest records no digests (as written before accel recorded them)."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(checkpoint, target)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest.pop("sha256", None)
    (target / MANIFEST).write_text(json.dumps(manifest))
    return target


def loader(args: argparse.Namespace) -> dict[str, float]:
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(data_seed=0))
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(args.samples, args.features, generator=g), torch.arange(args.samples))
    plain = DataLoader(
        dataset,
        batch_size=args.batch,
        sampler=DistributedSampler(
            dataset, num_replicas=accelerator.num_processes, rank=accelerator.process_index, shuffle=True, seed=0
        ),
    )
    prepared = accelerator.prepare(DataLoader(dataset, batch_size=args.batch, shuffle=True))
    accelerator.dataloader_config.dispatch_batches = True
    dispatched = accelerator.prepare(DataLoader(dataset, batch_size=args.batch, shuffle=True))
    variants = {"plain_distributed_sampler": plain, "accel": prepared, "accel_dispatch": dispatched}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for epoch in range(args.rounds + 1):
        for name, dl in variants.items():
            if isinstance(dl.sampler, DistributedSampler):
                dl.sampler.set_epoch(epoch)  # the plain loader needs it by hand; accel's does it itself
            dist.barrier()
            t0 = time.perf_counter()
            seen = sum(int(y.numel()) for _, y in dl)
            elapsed = time.perf_counter() - t0
            if epoch:  # the first round warms up
                times[name].append(seen / elapsed)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["checkpoint", "loader"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2, help="rounds run first and dropped")
    parser.add_argument(
        "--sizes", type=lambda text: [int(x) for x in text.split(",")], default=[100, 1000], help="MB, checkpoint"
    )
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: the temp dir)")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    result: Any = checkpoint(args) if args.what == "checkpoint" else loader(args)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
