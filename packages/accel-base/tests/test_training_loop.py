"""The training step: DDP equivalence, accumulation, no_sync, precision, loss scaling, clipping, schedulers.

Each result is compared with the same training done by hand in plain PyTorch.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from accel import Accelerator, GradScalerKwargs
from conftest import launch
from torch.testing import assert_close

# Shared by the 2-process worker and the single-process references in this file.
COMMON = """
import torch

def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

def make_data(n=32):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)

def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])

def flat_grads(model):
    return torch.cat([p.grad.detach().flatten() for p in model.parameters()])
"""
_ns: dict[str, Any] = {}
exec(COMMON, _ns)
build_model, make_data, flat_params, flat_grads = (
    _ns["build_model"],
    _ns["make_data"],
    _ns["flat_params"],
    _ns["flat_grads"],
)

LR = 0.1


def _reference_sgd(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.nn.Module:
    """Plain single-process SGD, one step per (x, y) batch with the mean squared error."""
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in batches:
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model


# ---- single process ------------------------------------------------------------------------
def test_accumulate_over_k_micro_batches_equals_one_big_batch() -> None:
    k, micro = 3, 4
    acc = Accelerator(gradient_accumulation_steps=k)
    x, y = make_data(2 * k * micro)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    syncs = []
    for step in range(2 * k):
        before = flat_params(model).clone()
        with acc.accumulate(model):
            xs, ys = x[step * micro : (step + 1) * micro], y[step * micro : (step + 1) * micro]
            acc.backward(torch.nn.functional.mse_loss(model(xs), ys))
            syncs.append(acc.sync_gradients)
            opt.step()
            opt.zero_grad()
        if not syncs[-1]:
            assert torch.equal(flat_params(model), before)  # no step between syncs
    assert syncs == [False, False, True, False, False, True]
    big = k * micro
    reference = _reference_sgd([(x[:big], y[:big]), (x[big:], y[big:])])
    assert_close(flat_params(model), flat_params(reference))


def test_scheduler_follows_the_optimizer_during_accumulation() -> None:
    acc = Accelerator(gradient_accumulation_steps=2)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    model, opt, sched = acc.prepare(model, opt, sched)
    x, y = make_data(8)
    lrs = []
    for i in range(4):
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
            opt.step()
            sched.step()
            opt.zero_grad()
        lrs.append(sched.get_last_lr()[0])
    assert lrs == [LR, LR * 0.5, LR * 0.5, LR * 0.25]


def test_fp16_overflow_skips_the_step_and_the_scheduler() -> None:
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    assert isinstance(acc.scaler, torch.amp.GradScaler)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    model, opt, sched = acc.prepare(model, opt, sched)
    x, y = make_data(8)

    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    model[0].weight.grad[0, 0] = float("inf")
    before = flat_params(model).clone()
    opt.step()
    sched.step()
    opt.zero_grad()
    assert acc.optimizer_step_was_skipped is True
    assert torch.equal(flat_params(model), before)
    assert sched.get_last_lr() == [LR]
    assert sched.scheduler.last_epoch == 0
    assert acc.scaler.get_scale() == 512.0  # backed off by 0.5

    # The next, finite step goes through, with the gradients unscaled.
    ref = build_model()
    with torch.autocast("cpu", dtype=torch.float16):
        ref_loss = torch.nn.functional.mse_loss(ref(x).float(), y)
    ref_loss.backward()
    expected = before - LR * flat_grads(ref)
    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped is False
    assert sched.get_last_lr() == [LR * 0.5]
    assert_close(flat_params(model), expected, rtol=1e-4, atol=1e-6)


class _DtypeProbe(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.seen: tuple[Any, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        self.seen = (h.dtype, torch.is_autocast_enabled("cpu"))
        return h


def test_bf16_runs_the_forward_in_bf16_and_returns_fp32() -> None:
    acc = Accelerator(mixed_precision="bf16")
    torch.manual_seed(0)
    model = acc.prepare(_DtypeProbe())
    x = torch.randn(3, 4)
    out = model(x)
    assert model.seen == (torch.bfloat16, True)
    assert out.dtype == torch.float32
    assert not torch.is_autocast_enabled("cpu")  # only inside the forward
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model.lin(x).float()
    assert torch.equal(out, reference)
    with acc.autocast():
        assert (model.lin(x).dtype, torch.get_autocast_dtype("cpu")) == (torch.bfloat16, torch.bfloat16)

    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    plain(x)
    assert plain.seen == (torch.float32, False)


def test_no_precision_means_no_autocast() -> None:
    acc = Accelerator()
    model = acc.prepare(_DtypeProbe())
    assert model(torch.randn(2, 4)).dtype == torch.float32
    assert model.seen == (torch.float32, False)


def test_clip_grad_norm_returns_the_norm_before_clipping() -> None:
    acc = Accelerator()
    model = build_model()
    model, _opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    x, y = make_data(8)
    acc.backward(torch.nn.functional.mse_loss(model(x), y) * 100)
    grads = flat_grads(model).clone()
    norm = torch.sqrt((grads.double() ** 2).sum()).float()
    max_norm = float(norm) / 4
    returned = acc.clip_grad_norm_(model.parameters(), max_norm)
    assert_close(returned, norm)
    assert_close(flat_grads(model), grads * (max_norm / (float(norm) + 1e-6)))
    assert_close(torch.linalg.vector_norm(flat_grads(model)), torch.tensor(max_norm), rtol=1e-5, atol=0)


def test_clip_grad_norm_under_fp16_sees_unscaled_gradients() -> None:
    acc = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=256.0)])
    model = build_model()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    x, y = make_data(8)
    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    scaled = flat_grads(model).clone()
    returned = acc.clip_grad_norm_(model.parameters(), 1e9)
    assert_close(returned, torch.linalg.vector_norm(scaled / 256.0))
    assert_close(flat_grads(model), scaled / 256.0)
    opt.step()  # the scaler knows the gradients are unscaled already: no double unscale
    assert acc.optimizer_step_was_skipped is False


def test_clip_grad_value() -> None:
    acc = Accelerator()
    model = acc.prepare(build_model())
    x, y = make_data(8)
    acc.backward(torch.nn.functional.mse_loss(model(x), y) * 100)
    grads = flat_grads(model).clone()
    acc.clip_grad_value_(model.parameters(), 0.05)
    assert torch.equal(flat_grads(model), grads.clamp(-0.05, 0.05))


# ---- two processes ------------------------------------------------------------------------------
WORKER = (
    COMMON
    + """
import json, os, sys
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator
from accel.scheduler import AcceleratedScheduler

LR = 0.1
out = {}
acc = Accelerator()
rank = acc.process_index
mse = torch.nn.functional.mse_loss
x, y = make_data(32)

def gathered(t):
    return acc.gather(t[None]).tolist()

# 1. DDP: each rank 4 samples per step (batches dealt round-robin) == one process on 8.
model = build_model()
opt = torch.optim.SGD(model.parameters(), lr=LR)
loader = DataLoader(TensorDataset(x, y), batch_size=4)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
norms = []
for xb, yb in loader:
    acc.backward(mse(model(xb), yb))
    norms.append(acc.clip_grad_norm_(model.parameters(), 1e9).item())
    opt.step()
    sched.step()
    opt.zero_grad()
out["ddp_params"] = flat_params(model).tolist()
out["clip_norms"] = norms
# Without split_batches a prepared scheduler steps once per process per optimizer step.
out["sched_last_epoch"] = sched.scheduler.last_epoch
raw = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), lambda s: 1.0)
split = AcceleratedScheduler(raw, [], split_batches=True)
split.step()
out["split_sched_last_epoch"] = raw.last_epoch

# 2. Accumulation over 2 micro-batches of 2 per rank == one step on 8 samples.
acc2 = Accelerator(gradient_accumulation_steps=2)
m2 = build_model()
o2 = torch.optim.SGD(m2.parameters(), lr=LR)
m2, o2 = acc2.prepare(m2, o2)
record = []
for step in range(4):  # two optimizer steps
    base = (step // 2) * 8 + (step % 2) * 4 + rank * 2
    with acc2.accumulate(m2):
        acc2.backward(mse(m2(x[base:base + 2]), y[base:base + 2]))
        record.append({"sync": acc2.sync_gradients, "grads": gathered(flat_grads(m2))})
        o2.step()
        o2.zero_grad()
out["accum_record"] = record
out["accum_params"] = flat_params(m2).tolist()

# 3. Explicit no_sync: local gradients inside, the average of everything after a synced backward.
acc.gradient_accumulation_steps = 1  # shared state: back to unscaled losses
m3 = acc.prepare(build_model())
with acc.no_sync(m3):
    acc.backward(mse(m3(x[rank:rank + 1]), y[rank:rank + 1]))
out["no_sync_grads"] = gathered(flat_grads(m3))
acc.backward(mse(m3(x[2 + rank:3 + rank]), y[2 + rank:3 + rank]))
out["synced_grads"] = gathered(flat_grads(m3))

with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
"""
)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("training")
    script = directory / "worker.py"
    script.write_text(WORKER)
    launch(script, str(directory))
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(2)]


def test_ddp_on_two_processes_equals_one_process_on_the_full_batch(two_process_run: list[dict[str, Any]]) -> None:
    x, y = make_data(32)
    reference = _reference_sgd([(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)])
    for out in two_process_run:
        assert_close(torch.tensor(out["ddp_params"]), flat_params(reference))
    assert two_process_run[0]["ddp_params"] == two_process_run[1]["ddp_params"]


def test_clip_grad_norm_on_two_processes_is_the_global_norm(two_process_run: list[dict[str, Any]]) -> None:
    x, y = make_data(32)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    expected = []
    for i in range(0, 32, 8):
        torch.nn.functional.mse_loss(model(x[i : i + 8]), y[i : i + 8]).backward()
        expected.append(torch.linalg.vector_norm(flat_grads(model)).item())
        opt.step()
        opt.zero_grad()
    for out in two_process_run:
        assert_close(torch.tensor(out["clip_norms"]), torch.tensor(expected))


def test_scheduler_steps_once_per_process_without_split_batches(two_process_run: list[dict[str, Any]]) -> None:
    for out in two_process_run:
        assert out["sched_last_epoch"] == 4 * 2  # 4 optimizer steps x 2 processes
        assert out["split_sched_last_epoch"] == 1


def test_accumulation_on_two_processes_equals_one_big_batch(two_process_run: list[dict[str, Any]]) -> None:
    x, y = make_data(32)
    reference = _reference_sgd([(x[0:8], y[0:8]), (x[8:16], y[8:16])])
    for out in two_process_run:
        assert [r["sync"] for r in out["accum_record"]] == [False, True, False, True]
        assert_close(torch.tensor(out["accum_params"]), flat_params(reference))
    record = two_process_run[0]["accum_record"]
    # Inside the accumulation the ranks hold their own gradients; on the sync step, the same ones.
    assert record[0]["grads"][0] != record[0]["grads"][1]
    assert record[1]["grads"][0] == record[1]["grads"][1]
    first = build_model()
    torch.nn.functional.mse_loss(first(x[0:8]), y[0:8]).backward()
    assert_close(torch.tensor(record[1]["grads"][0]), flat_grads(first))


def test_no_sync_keeps_gradients_local_until_a_synced_backward(two_process_run: list[dict[str, Any]]) -> None:
    x, y = make_data(32)
    local, synced = two_process_run[0]["no_sync_grads"], two_process_run[0]["synced_grads"]
    assert local[0] != local[1]
    assert synced[0] == synced[1]
    mse = torch.nn.functional.mse_loss
    per_rank_local, per_rank_total = [], []
    for rank in range(2):
        model = build_model()
        mse(model(x[rank : rank + 1]), y[rank : rank + 1]).backward()
        per_rank_local.append(flat_grads(model).clone())
        mse(model(x[2 + rank : 3 + rank]), y[2 + rank : 3 + rank]).backward()
        per_rank_total.append(flat_grads(model))
    for rank in range(2):
        assert_close(torch.tensor(local[rank]), per_rank_local[rank])
    # DDP all-reduces the whole accumulated .grad on the synced backward.
    assert_close(torch.tensor(synced[0]), (per_rank_total[0] + per_rank_total[1]) / 2)
