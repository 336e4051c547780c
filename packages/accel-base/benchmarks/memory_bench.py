"""Per-rank memory by strategy: the bytes of live tensors each process holds after a step.

    accel launch --num-processes 2 packages/accel-base/benchmarks/memory_bench.py \
        --strategy fsdp2 --out memory.json [--layers 8 --hidden 1024]

The model (`--layers` x Linear(hidden, hidden)) trains one AdamW step through the strategy;
then every tensor storage reachable from Python (parameters or their shards, gradients,
optimizer state, the strategy's own buffers) is counted once. Counting tensors rather than
the process's resident memory makes the figure exact and independent of the allocator and
of machine load; the same count for the model on one process (parameters, gradients, two
Adam moments) is the reference. Rank 0 writes the result, per rank, to `--out`.

DeepSpeed allocates its communication buckets up front at its default sizes (5e8 elements,
2 GB in fp32, for ZeRO-3's reduce bucket); they are set here to DDP's default bucket, 25 MB,
so that the figure compares sharding rather than buffer defaults.
"""

from __future__ import annotations

import argparse
import gc
import json

import torch
import torch.distributed as dist
from accel import Accelerator, DeepSpeedPlugin


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage reachable from Python objects."""
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: some lazy modules warn on __class__
            continue
        local = obj.to_local() if hasattr(obj, "to_local") else obj  # DTensor: this rank's shard
        try:
            storage = local.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage of their own
            continue
        if storage.device.type != "meta":
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True, help="ddp, fsdp2, or deepspeed-zero<stage>")
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()

    kwargs: dict[str, object] = {}
    if args.strategy.startswith("deepspeed-zero"):
        stage = int(args.strategy.removeprefix("deepspeed-zero"))
        bucket = 25 * 2**20 // 4  # fp32 elements in DDP's default 25 MB bucket
        zero = {"stage": stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
        if stage == 3:
            zero["stage3_prefetch_bucket_size"] = bucket
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=stage, extra_config={"zero_optimization": zero})
    else:
        kwargs["strategy"] = args.strategy
    accelerator = Accelerator(**kwargs)  # type: ignore[arg-type]
    baseline = live_tensor_bytes()

    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.hidden, args.hidden) for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, args.hidden)
    loader = torch.utils.data.DataLoader(list(range(16 * accelerator.num_processes)), batch_size=16)
    model, optimizer, _ = accelerator.prepare(model, optimizer, loader)
    accelerator.backward(model(x.to(accelerator.device)).square().mean())
    optimizer.step()
    del layers

    held = live_tensor_bytes() - baseline
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(accelerator.num_processes)]
    dist.all_gather(every, torch.tensor([float(held)], dtype=torch.float64))
    if accelerator.is_main_process:
        # One process, plain AdamW: parameters, gradients and two moments, 4 bytes each.
        reference = 4 * 4 * n_params
        result = {
            "strategy": args.strategy,
            "processes": accelerator.num_processes,
            "parameters": n_params,
            "single_process_model_state_bytes": reference,
            "per_rank_bytes": [int(t.item()) for t in every],
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        mb = ", ".join(f"{b / 2**20:.1f}" for b in result["per_rank_bytes"])
        print(f"{args.strategy}: per-rank MB {mb} (one process: {reference / 2**20:.1f} MB)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
