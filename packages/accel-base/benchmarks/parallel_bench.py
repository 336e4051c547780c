"""N-D parallelism: per-rank training-state bytes and step time, accel against raw torch in one run.

    accel launch --num-processes 2 packages/accel-base/benchmarks/parallel_bench.py --out parallel2.json
    accel launch --num-processes 4 packages/accel-base/benchmarks/parallel_bench.py --out parallel4.json

The model is a small transformer: 2 blocks of causal attention + MLP (hidden `--hidden`,
256 by default), with a `tp_plan` in the transformers convention. Layouts: on 2 processes
DDP, FSDP2 (dp_shard=2) and TP (tp=2); on 4 processes FSDP2 x TP (dp_shard=2, tp=2).

1. Bytes: after one AdamW step, the bytes of this rank's parameters, gradients and optimizer
   state, counting each tensor's local shard (`DTensor.to_local()`), against the same count
   for the unsharded model on one process. The theoretical share is 1/N for the dimensions
   that shard (1 for DDP, 1/2 for FSDP2 and for TP's split weights; TP keeps norms and the
   embedding/head replicated, so its figure sits above 1/2). Exact: independent of load.
2. Step time: each layout through accel (`Accelerator(parallelism_config=...)`, or the ddp
   strategy) and the same composition written with raw torch (`DistributedDataParallel`
   with accel's settings, `parallelize_module` with the same plan, `fully_shard` on every
   block then on the root, as accel wraps), trained on the same batches. Rounds alternate
   the two and rotate their order; the ratio accel / raw is taken per round and reported as
   median and range. Rank 0 writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from accel import Accelerator, DistributedDataParallelKwargs, ParallelismConfig
from accel.state import AcceleratorState, GradientState
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP

HEADS = 4
SEQ = 32
PLAN = {
    "layers.*.attn.q": "colwise",
    "layers.*.attn.k": "colwise",
    "layers.*.attn.v": "colwise",
    "layers.*.attn.o": "rowwise",
    "layers.*.up": "colwise",
    "layers.*.down": "rowwise",
}
# layout -> (processes, ParallelismConfig sizes or None for the ddp strategy)
LAYOUTS: dict[str, tuple[int, dict[str, int] | None]] = {
    "ddp": (2, None),
    "fsdp2": (2, {"dp_shard_size": 2}),
    "tp": (2, {"tp_size": 2}),
    "fsdp2_tp": (4, {"dp_shard_size": 2, "tp_size": 2}),
}


class Attn(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them.
        q, k, v = (p(x).view(b, t, -1, self.d // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attn(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Net(nn.Module):
    tp_plan = PLAN

    def __init__(self, d: int, vocab: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d) for _ in range(2)])
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def theoretical_share(model: nn.Module, sizes: dict[str, int] | None) -> float:
    """The fraction of the one-process state a rank holds if every split were exact: TP splits the
    weights its plan names by `tp` (and colwise biases; a rowwise bias stays replicated), FSDP2 splits
    everything by `dp_shard`, DDP splits nothing."""
    sizes = sizes or {}
    tp, dp = sizes.get("tp_size", 1), sizes.get("dp_shard_size", 1)
    styles = {f"layers.{i}.{p.split('.', 2)[2]}": s for i in range(len(model.layers)) for p, s in PLAN.items()}  # type: ignore[arg-type]
    split = 0
    for name, p in model.named_parameters():
        module, kind = name.rsplit(".", 1)
        if module in styles and (kind == "weight" or styles[module] == "colwise"):
            split += p.numel()
    total = sum(p.numel() for p in model.parameters())
    return (split / tp + (total - split)) / dp / total


def state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards of DTensors)."""

    def nbytes(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        local = t.to_local() if isinstance(t, DTensor) else t
        return local.numel() * local.element_size()

    params = list(model.parameters())
    optim = sum(nbytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return {
        "parameters": sum(nbytes(p) for p in params),
        "gradients": sum(nbytes(p.grad) for p in params),
        "optimizer": optim,
    }


def raw_build(layout: str, base: nn.Module, sizes: dict[str, int] | None, device_type: str) -> nn.Module:
    """The layout written by hand with torch's own APIs, composed as accel composes it."""
    model = copy.deepcopy(base)
    if sizes is None:
        return DDP(model, **DistributedDataParallelKwargs().ddp_kwargs())
    names = [n for n in ("dp_shard", "tp") if sizes.get(f"{n}_size", 1) > 1]
    mesh = init_device_mesh(device_type, tuple(sizes[f"{n}_size"] for n in names), mesh_dim_names=tuple(names))
    if "tp" in names:
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        plan = {}
        for pattern, style in PLAN.items():
            for i in range(len(model.layers)):  # type: ignore[arg-type]
                plan[pattern.replace("*", str(i))] = styles[style]()
        parallelize_module(model, mesh["tp"], plan)
    if "dp_shard" in names:
        for block in model.layers:  # type: ignore[union-attr]
            fully_shard(block, mesh=mesh["dp_shard"])
        fully_shard(model, mesh=mesh["dp_shard"], reshard_after_forward=False)
    return model


def accel_build(sizes: dict[str, int] | None, base: nn.Module) -> tuple[Accelerator, nn.Module, Any]:
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    acc = (
        Accelerator(strategy="ddp") if sizes is None else Accelerator(parallelism_config=ParallelismConfig(**sizes))  # type: ignore[arg-type]
    )
    model = copy.deepcopy(base)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    return acc, model, opt


def batches(dp_rank: int, n_dp: int, batch: int, vocab: int = 512) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for step in range(4):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randint(0, vocab, (batch * n_dp, SEQ), generator=g)
        y = torch.randint(0, vocab, (batch * n_dp, SEQ), generator=g)
        sl = slice(dp_rank * batch, (dp_rank + 1) * batch)
        out.append((x[sl], y[sl]))
    return out


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if isinstance(out, DTensor):
        out = out.full_tensor()
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4, help="sequences per data-parallel rank")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    probe = Accelerator()
    world, rank, device = probe.num_processes, probe.process_index, probe.device
    torch.manual_seed(0)
    base = Net(args.hidden)
    single = state_bytes(base, torch.optim.AdamW(base.parameters()))
    n_params = sum(p.numel() for p in base.parameters())
    single = {"parameters": single["parameters"], "gradients": single["parameters"], "optimizer": 2 * 4 * n_params}
    results: dict[str, Any] = {
        "model": {"hidden": args.hidden, "blocks": 2, "parameters": n_params, "seq": SEQ},
        "single_process_bytes": single,
        "layouts": {},
    }
    for layout, (nproc, sizes) in LAYOUTS.items():
        if nproc != world:
            continue
        acc, ours, ours_opt = accel_build(sizes, base)
        n_dp, dp_rank = acc._data_shards()
        raw = raw_build(layout, base, sizes, device.type)
        raw_opt = torch.optim.AdamW(raw.parameters(), lr=1e-3)
        data = batches(dp_rank, n_dp, args.batch)

        def accel_step(
            x: torch.Tensor, y: torch.Tensor, acc: Accelerator = acc, m: Any = ours, o: Any = ours_opt
        ) -> float:
            loss = loss_of(m, x, y)
            acc.backward(loss)
            o.step()
            o.zero_grad(set_to_none=True)
            return loss.item()

        def raw_step(x: torch.Tensor, y: torch.Tensor, m: Any = raw, o: Any = raw_opt) -> float:
            loss = loss_of(m, x, y)
            loss.backward()
            o.step()
            o.zero_grad(set_to_none=True)
            return loss.item()

        variants = {"accel": accel_step, "raw": raw_step}
        # Same first step: the two compositions compute the same loss (a check that raw = accel's composition).
        first = {name: fn(*data[0]) for name, fn in variants.items()}
        # Bytes after one step with gradients kept: step again without zero_grad.
        loss = loss_of(ours, *data[1])
        acc.backward(loss)
        ours_opt.step()
        mine = state_bytes(ours, ours_opt)
        ours_opt.zero_grad(set_to_none=True)
        loss = loss_of(raw, *data[1])
        loss.backward()
        raw_opt.step()
        raw_mine = state_bytes(raw, raw_opt)
        raw_opt.zero_grad(set_to_none=True)
        all_bytes: list[dict[str, int]] = [{} for _ in range(world)]
        dist.all_gather_object(all_bytes, mine)
        times: dict[str, list[float]] = {name: [] for name in variants}
        ratios: list[float] = []
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            this: dict[str, float] = {}
            for name in order:
                dist.barrier()
                t0 = time.perf_counter()
                for s in range(args.steps):
                    variants[name](*data[s % len(data)])
                dist.barrier()
                this[name] = (time.perf_counter() - t0) / args.steps
                times[name].append(this[name])
            ratios.append(this["accel"] / this["raw"])
        total_single = sum(single.values())
        results["layouts"][layout] = {
            "processes": world,
            "sizes": sizes or {"ddp": world},
            "first_loss": first,
            "per_rank_bytes": all_bytes,
            "raw_rank0_bytes": raw_mine,
            "theoretical_share": round(theoretical_share(base, sizes), 4),
            "naive_1_over_n": round(1 / (world if sizes else 1), 4),
            "per_rank_over_single": [round(sum(b.values()) / total_single, 4) for b in all_bytes],
            "step_ms": {name: round(statistics.median(v) * 1e3, 3) for name, v in times.items()},
            "ratio_rounds": sorted(round(x, 4) for x in ratios),
            "ratio_median": round(statistics.median(ratios), 4),
        }
        if rank == 0:
            print(f"{layout}: {results['layouts'][layout]}", flush=True)
        del ours, ours_opt, raw, raw_opt
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
