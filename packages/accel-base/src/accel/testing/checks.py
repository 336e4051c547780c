"""The conformance checks, as run inside each worker process of the kit.

Each check builds its own `Accelerator` on the adapter the launcher selected, does one
thing the way a user's script would, and returns plain numbers (JSON). It asserts
nothing itself: the suite (`accel.testing.suite`) compares what every rank returned with
a reference it computes another way, in its own process, without accel.

A check's name may carry an argument after a colon: `training:fsdp2` runs `training`
with the fsdp2 strategy. The checks about models and state live in `checks_models`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from ..accelerator import Accelerator
from ..distributed import ops
from ..settings.kwargs import GradScalerKwargs, KwargsHandler
from .problems import (
    FP8_DIMS,
    HIDDEN,
    IN,
    LR,
    OUT,
    PER_RANK,
    build_model,
    flat_grads,
    flat_params,
    make_data,
    rank_slice,
)

CheckFn = Callable[[Path, str], dict[str, Any]]
CHECKS: dict[str, CheckFn] = {}
TRAIN_STEPS = 3
CONVERGE_STEPS = 30
CLIP_NORM = 0.01
FP16_INIT_SCALE = 1024.0


def check(name: str) -> Callable[[CheckFn], CheckFn]:
    def register(fn: CheckFn) -> CheckFn:
        CHECKS[name] = fn
        return fn

    return register


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _mse(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))


def _sgd_setup(acc: Accelerator, **model_kwargs: Any) -> tuple[torch.nn.Module, Any]:
    model = build_model(**model_kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    return acc.prepare(model, opt)  # type: ignore[no-any-return]


def _train_slices(
    acc: Accelerator,
    model: torch.nn.Module,
    opt: Any,
    steps: int,
    shard: tuple[int, int] | None = None,
    mean_loss: bool = False,
) -> list[float]:
    """Train `steps` SGD steps on this process's slice of the kit's data; `shard` is (number of data
    shards, this process's shard), default one per rank; `mean_loss` records the loss averaged over ranks."""
    n_shards, index = shard if shard is not None else _rank_world()[::-1]
    x, y = make_data(steps * PER_RANK * n_shards)
    losses = []
    for step in range(steps):
        s = rank_slice(step, index, n_shards)
        loss = _mse(model, x[s], y[s], acc.device)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean").item()) if mean_loss else float(loss.detach()))
    return losses


@check("process_state")
def process_state(_: Path, __: str) -> dict[str, Any]:
    acc = Accelerator()
    model = acc.prepare(build_model())
    return {
        "num_processes": acc.num_processes,
        "process_index": acc.process_index,
        "local_process_index": acc.local_process_index,
        "is_main_process": acc.is_main_process,
        "is_local_main_process": acc.is_local_main_process,
        "device_type": acc.device.type,
        "adapter_device_type": acc.adapter.device_type,
        "param_device_type": next(model.parameters()).device.type,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "adapter_backend": acc.adapter.backend,
        "use_distributed": acc.use_distributed,
        "distributed_type": str(acc.distributed_type),
        "adapter": acc.adapter.name,
        "emulate": acc.adapter.emulate,
    }


@check("sharding")
def sharding(_: Path, __: str) -> dict[str, Any]:
    n = 13  # not a multiple of batch * world: the last round is padded, and must be dropped again
    acc = Accelerator()
    plain = acc.prepare(DataLoader(TensorDataset(torch.arange(n)), batch_size=2))
    mine, gathered = [], []
    for (batch,) in plain:
        mine.append(batch.tolist())
        gathered += acc.gather_for_metrics(batch).tolist()
    shuffled = acc.prepare(DataLoader(TensorDataset(torch.arange(n)), batch_size=2, shuffle=True))
    epochs = []
    for _epoch in range(2):
        epochs.append([v for (batch,) in shuffled for v in acc.gather_for_metrics(batch).tolist()])
    objects: list[Any] = []
    for (batch,) in plain:
        objects += acc.gather_for_metrics([f"sample-{int(v)}" for v in batch], use_gather_object=True)
    return {"n": n, "batches": mine, "gathered": gathered, "shuffled_epochs": epochs, "objects": objects}


@check("training")
def training(_: Path, strategy: str) -> dict[str, Any]:
    acc = Accelerator(strategy=strategy)
    model, opt = _sgd_setup(acc)
    losses = _train_slices(acc, model, opt, TRAIN_STEPS)
    return {"params": flat_params(acc.unwrap_model(model)).tolist(), "losses": losses}


@check("accumulation")
def accumulation(_: Path, __: str) -> dict[str, Any]:
    k = 2
    acc = Accelerator(gradient_accumulation_steps=k)
    model, opt = _sgd_setup(acc)
    rank, world = _rank_world()
    x, y = make_data(TRAIN_STEPS * PER_RANK * world)
    micro = PER_RANK // k
    syncs = []
    for step in range(TRAIN_STEPS):
        start = rank_slice(step, rank, world).start
        for i in range(k):
            with acc.accumulate(model):
                s = slice(start + i * micro, start + (i + 1) * micro)
                acc.backward(_mse(model, x[s], y[s], acc.device))
                syncs.append(acc.sync_gradients)
                opt.step()
                opt.zero_grad()
    return {"params": flat_params(acc.unwrap_model(model)).tolist(), "sync_gradients": syncs}


@check("no_sync")
def no_sync(_: Path, __: str) -> dict[str, Any]:
    acc = Accelerator()
    model, opt = _sgd_setup(acc)
    rank, world = _rank_world()
    x, y = make_data(PER_RANK * world)
    s = rank_slice(0, rank, world)
    with acc.no_sync(model):
        acc.backward(_mse(model, x[s], y[s], acc.device))
    local = flat_grads(acc.unwrap_model(model)).tolist()
    opt.zero_grad()
    acc.backward(_mse(model, x[s], y[s], acc.device))
    synced = flat_grads(acc.unwrap_model(model)).tolist()
    return {"local": local, "synced": synced}


@check("collectives")
def collectives(_: Path, __: str) -> dict[str, Any]:
    acc = Accelerator()
    rank = acc.process_index
    t = torch.tensor([rank * 10 + 1.0, rank * 10 + 2.0], device=acc.device)
    ragged = torch.arange(2 * (rank + 1), dtype=torch.float32, device=acc.device).reshape(rank + 1, 2) + 100 * rank
    nested = acc.gather({"a": t, "b": [t * 2, t.long()]})
    padded = acc.pad_across_processes(ragged, dim=0, pad_index=-1)
    padded_first = acc.pad_across_processes(ragged, dim=0, pad_index=-1, pad_first=True)
    with acc.split_between_processes(list(range(5))) as part:
        split = list(part)
    with acc.split_between_processes(list(range(5)), apply_padding=True) as part:
        split_padded = list(part)
    acc.wait_for_everyone()
    return {
        "gather": acc.gather(t).tolist(),
        "gather_device_type": acc.gather(t).device.type,
        "nested_a": nested["a"].tolist(),
        "nested_b0": nested["b"][0].tolist(),
        "nested_b1": nested["b"][1].tolist(),
        "nested_b1_dtype": str(nested["b"][1].dtype),
        "reduce_sum": acc.reduce(t.clone(), "sum").tolist(),
        "reduce_mean": acc.reduce(t.clone(), "mean").tolist(),
        "broadcast_0": acc.broadcast(t.clone(), from_process=0).tolist(),
        "broadcast_last": acc.broadcast(t.clone(), from_process=acc.num_processes - 1).tolist(),
        "padded": padded.tolist(),
        "padded_first": padded_first.tolist(),
        "gather_padded": acc.gather(padded).tolist(),
        "gather_object": ops.gather_object({"rank": rank}),
        "split": split,
        "split_padded": split_padded,
    }


def _inner_dtype_probe(model: torch.nn.Module) -> list[str]:
    """Records the dtype of the first layer's output on every forward.

    The first leaf module that holds parameters, not the first `nn.Linear`: fp8 conversion
    swaps the Linear layers for the vendor's own classes.
    """
    seen: list[str] = []
    first = next(
        m for m in model.modules() if next(m.children(), None) is None and next(m.parameters(False), None) is not None
    )
    first.register_forward_hook(lambda _m, _i, out: seen.append(str(out.dtype)))
    return seen


@check("precision")
def precision(_: Path, mode: str) -> dict[str, Any]:
    dims = FP8_DIMS if mode == "fp8" else (IN, HIDDEN, OUT)
    # A moderate initial scale: at the default 2**16 the fp16 activation gradients of the
    # first steps overflow and are skipped, which is correct but hides the scaling itself.
    handlers: list[KwargsHandler] = [GradScalerKwargs(init_scale=FP16_INIT_SCALE)] if mode == "fp16" else []
    acc = Accelerator(mixed_precision=mode, kwargs_handlers=handlers)
    model, opt = _sgd_setup(acc, dims=dims)
    rank, world = _rank_world()
    seen = _inner_dtype_probe(acc.unwrap_model(model))
    x, y = make_data(CONVERGE_STEPS * PER_RANK * world, dims=dims)
    with torch.no_grad():
        out = model(x[:PER_RANK].to(acc.device))
    result: dict[str, Any] = {
        "output": out.detach().float().cpu().tolist(),
        "output_dtype": str(out.dtype),
        "inner_dtypes": seen[:1],
        # What users save: an adapter may train in half-precision parameters (split fp32
        # masters, as some vendor optimizers do) but the full state dict must hold fp32 weights.
        "state_dict_dtypes": sorted(
            {str(t.dtype) for t in acc.get_state_dict(model).values() if t.is_floating_point()}
        ),
        "module_types": [type(m).__name__ for m in acc.unwrap_model(model).modules()],
    }
    if mode == "fp16":
        result.update(_fp16_scaling(acc, model, opt, x, y))
    result["eval_before"] = _eval_loss(acc, model, x, y)
    losses = []
    for step in range(CONVERGE_STEPS):
        s = rank_slice(step, rank, world)
        loss = _mse(model, x[s], y[s], acc.device)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    result["losses"] = losses
    result["eval_after"] = _eval_loss(acc, model, x, y)
    return result


def _eval_loss(acc: Accelerator, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """The loss over the whole data set: how far training has come, without the noise of one batch."""
    with torch.no_grad():
        return float(_mse(model, x, y, acc.device))


def _fp16_scaling(acc: Accelerator, model: torch.nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Loss scaling: unscaled gradients are the true ones; an inf skips the step and the scheduler."""
    rank, world = _rank_world()
    sched = acc.prepare(torch.optim.lr_scheduler.StepLR(opt.optimizer, step_size=1, gamma=0.5))
    scaler = acc.scaler
    assert scaler is not None, "mixed_precision='fp16' prepared no grad scaler"
    s = rank_slice(0, rank, world)
    scale = float(scaler.get_scale())
    acc.backward(_mse(model, x[s], y[s], acc.device))
    scaled = flat_grads(acc.unwrap_model(model))
    acc.unscale_gradients()
    unscaled = flat_grads(acc.unwrap_model(model))
    opt.step()  # a real step: the scaler must not unscale twice, and updates its scale
    sched.step()
    opt.zero_grad()
    scale_before_inf = float(scaler.get_scale())
    before = flat_params(acc.unwrap_model(model))
    lr_before = sched.get_last_lr()[0]
    acc.backward(_mse(model, x[s], y[s], acc.device))
    next(p for p in acc.unwrap_model(model).parameters()).grad.view(-1)[0] = math.inf  # type: ignore[union-attr]
    opt.step()
    sched.step()
    opt.zero_grad()
    return {
        "initial_scale": scale,
        "scaled_over_unscaled": float((scaled.norm() / unscaled.norm()).item()),
        "unscaled_grads": unscaled.tolist(),
        "inf_step_skipped": bool(acc.optimizer_step_was_skipped),
        "inf_params_unchanged": bool(torch.equal(before, flat_params(acc.unwrap_model(model)))),
        "scale_before_inf": scale_before_inf,
        "inf_scale_after": float(scaler.get_scale()),
        "lr_before": lr_before,
        "lr_after": sched.get_last_lr()[0],
    }


@check("clip_grad_norm")
def clip_grad_norm(_: Path, strategy: str) -> dict[str, Any]:
    acc = Accelerator(strategy=strategy)
    model, opt = _sgd_setup(acc)
    rank, world = _rank_world()
    x, y = make_data(PER_RANK * world)
    s = rank_slice(0, rank, world)
    acc.backward(_mse(model, x[s], y[s], acc.device))
    norm = acc.clip_grad_norm_(model.parameters(), CLIP_NORM)
    clipped = flat_grads(acc.unwrap_model(model)).tolist()
    opt.step()
    return {"norm": float(_full_value(norm)), "clipped": clipped}


def _full_value(t: Any) -> float:
    full = getattr(t, "full_tensor", None)
    return float((full() if callable(full) else t).item()) if isinstance(t, torch.Tensor) else float(t)


# ---- N-D parallelism the adapter claims (Capabilities.parallelism) ------------------------------
TP_PLAN = {"0": "colwise", "2": "rowwise"}
"""The kit's two-layer MLP split Megatron-style: the first layer by output features, the second by input."""


@check("parallel")
def parallel(_: Path, kind: str) -> dict[str, Any]:
    """Train the kit's MLP under `kind` ("tp": tensor parallelism over every process; "hsdp": replicate x
    shard, 2 x (world / 2) on 4+ processes, else the 1 x world mesh) with SGD; return the losses (averaged
    over every rank), the gathered weights and the mesh the Accelerator built."""
    from ..strategies.parallelism_config import ParallelismConfig

    world = _rank_world()[1]
    if kind == "tp":
        pc = ParallelismConfig(tp_size=world, tp_plan=TP_PLAN)
    elif kind == "hsdp":
        replicate = 2 if world >= 4 and world % 2 == 0 else 1
        pc = ParallelismConfig(dp_replicate_size=replicate, dp_shard_size=world // replicate)
    else:
        raise ValueError(f"no parallel check for {kind!r}; the kit checks 'tp' and 'hsdp'")
    acc = Accelerator(parallelism_config=pc)
    mesh = acc.torch_device_mesh
    model, opt = _sgd_setup(acc)
    n_dp, dp_rank = acc._data_shards()
    losses = _train_slices(acc, model, opt, TRAIN_STEPS, shard=(n_dp, dp_rank), mean_loss=True)
    return {
        "losses": losses,
        "params": flat_params(acc.unwrap_model(model)).tolist(),
        "data_shards": n_dp,
        "mesh_device_type": mesh.device_type,
        "mesh": dict(zip(mesh.mesh_dim_names, mesh.mesh.shape)),
        "dtensor_params": sum(type(p).__name__ == "DTensor" for p in model.parameters()),
    }
