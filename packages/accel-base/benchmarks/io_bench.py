"""Worker for `nox -s bench`: checkpoint and data-loader throughput against plain PyTorch.

`checkpoint` (one process): `save_state`/`load_state` of a model and its AdamW state
against `safetensors.torch.save_file`/`load_file` of the same tensors in one file (the
load timed both lazily mapped and read into memory, which a restore has to do), rounds
alternating so load drift hits both alike, and `load_state` of the same checkpoint without its
recorded hashes, which prices the SHA-256 verification. `loader` (launched on 2 processes): one epoch
of a prepared loader (sharded, and with `dispatch_batches`) against a plain `DataLoader`
with `DistributedSampler`, same dataset, batch size and shuffling. Writes medians to JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from accel import Accelerator, DataLoaderConfiguration
from accel.checkpoint.state import MANIFEST
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def checkpoint(args: argparse.Namespace) -> dict[str, float]:
    accelerator = Accelerator()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.hidden, args.hidden) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    model(torch.randn(2, args.hidden)).sum().backward()
    opt.step()
    # The same tensors as one flat dict: weights plus both Adam moments of every parameter.
    tensors = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for pid, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0:
                tensors[f"opt.{pid}.{key}"] = value.clone()
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    times: dict[str, list[float]] = {
        name: []
        for name in ("plain_save", "accel_save", "plain_load_lazy", "plain_load", "accel_load", "accel_load_unverified")
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        plain, ours = Path(tmp) / "plain.safetensors", Path(tmp) / "ckpt"
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            save_file(tensors, str(plain))
            times["plain_save"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            accelerator.save_state(ours)
            times["accel_save"].append(time.perf_counter() - t0)
            # load_file maps the file lazily; reading the bytes is what a restore must do.
            t0 = time.perf_counter()
            lazy = load_file(str(plain))
            times["plain_load_lazy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            loaded = {k: v.clone() for k, v in load_file(str(plain)).items()}
            times["plain_load"].append(time.perf_counter() - t0)
            del lazy, loaded
            t0 = time.perf_counter()
            accelerator.load_state(ours)
            times["accel_load"].append(time.perf_counter() - t0)
            # The same checkpoint without recorded hashes (as written before they existed): the
            # difference is what verifying every file's SHA-256 costs.
            unverified = _without_hashes(ours, Path(tmp) / "unverified")
            t0 = time.perf_counter()
            accelerator.load_state(unverified)
            times["accel_load_unverified"].append(time.perf_counter() - t0)
    out = {name: statistics.median(ts) for name, ts in times.items()}
    out["megabytes"] = nbytes / 1e6
    return out


def _without_hashes(checkpoint: Path, target: Path) -> Path:
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
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dir", default=None, help="where checkpoints are written (default: the temp dir)")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    result = checkpoint(args) if args.what == "checkpoint" else loader(args)
    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
