"""`Accelerator.prepare`: order, validation, idempotence, and DDP wrapping on 2 real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from accel import Accelerator, DataLoaderShard
from accel.optimizer import AcceleratedOptimizer
from accel.scheduler import AcceleratedScheduler
from conftest import launch
from torch.utils.data import DataLoader, TensorDataset


def _objects() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader, torch.optim.lr_scheduler.LRScheduler]:
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.arange(8.0).reshape(4, 2)), batch_size=2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    return net, opt, loader, sched


class _MappedModel(torch.nn.Module):
    """Looks like a model loaded with `device_map=...` (and optionally in 8-bit)."""

    def __init__(self, device_map: dict[str, object], quantized: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.hf_device_map = device_map
        self.is_loaded_in_8bit = quantized


def test_any_order_returns_objects_in_the_order_given() -> None:
    acc = Accelerator()
    net, opt, loader, sched = _objects()
    p_sched, p_loader, p_net, p_opt = acc.prepare(sched, loader, net, opt)
    assert isinstance(p_sched, AcceleratedScheduler)
    assert isinstance(p_loader, DataLoaderShard)
    assert p_net is net  # one process: no wrapper
    assert isinstance(p_opt, AcceleratedOptimizer) and p_opt.optimizer is opt
    # The scheduler was given before its optimizer, yet it follows the prepared one.
    assert p_sched.optimizers == [p_opt]
    assert p_sched.scheduler is sched


def test_single_object_is_returned_alone() -> None:
    acc = Accelerator()
    net = torch.nn.Linear(2, 1)
    assert acc.prepare(net) is net
    loader = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    assert isinstance(acc.prepare(loader), DataLoaderShard)
    assert acc.prepare() == ()


def test_objects_of_unknown_kinds_pass_through() -> None:
    acc = Accelerator()
    marker = {"not": "preparable"}
    net = torch.nn.Linear(2, 1)
    out_marker, out_net = acc.prepare(marker, net)
    assert out_marker is marker and out_net is net


@pytest.mark.parametrize("flags", [[True], [True, False, True]])
def test_device_placement_length_is_checked(flags: list[bool]) -> None:
    acc = Accelerator()
    net, opt, _, _ = _objects()
    with pytest.raises(
        ValueError,
        match=r"^`device_placement` should be a list with 2 elements \(the number of objects passed\)\.$",
    ):
        acc.prepare(net, opt, device_placement=flags)


def test_device_placement_per_object() -> None:
    acc = Accelerator()
    loader_a = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    loader_b = DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=2)
    a, b = acc.prepare(loader_a, loader_b, device_placement=[True, False])
    assert a.device == acc.device
    assert b.device is None


def test_adapters_can_tell_a_requested_placement_from_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`RunContext.device_placement_requested`: True when the call asked (a `prepare` list, a
    `prepare_model` argument), False for the Accelerator's default, `Accelerator(device_placement=...)`
    included; `device_placement` carries the value either way."""
    acc = Accelerator(device_placement=False)
    seen: list[tuple[bool, bool]] = []
    original = acc.adapter.optimize_model

    def spy(model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        seen.append((ctx.device_placement, ctx.device_placement_requested))
        return original(model, ctx)

    monkeypatch.setattr(acc.adapter, "optimize_model", spy)
    acc.prepare(torch.nn.Linear(1, 1))
    acc.prepare(torch.nn.Linear(1, 1), device_placement=[True])
    acc.prepare(torch.nn.Linear(1, 1), device_placement=[False])
    acc.prepare_model(torch.nn.Linear(1, 1))
    acc.prepare_model(torch.nn.Linear(1, 1), device_placement=True)
    assert seen == [(False, False), (True, True), (False, True), (False, False), (True, True)]


def test_already_prepared_objects_are_returned_unchanged() -> None:
    acc = Accelerator()
    net, opt, loader, sched = _objects()
    first = acc.prepare(net, opt, loader, sched)
    second = acc.prepare(*first)
    assert all(a is b for a, b in zip(first, second))
    assert len(acc._models) == 1 and len(acc._dataloaders) == 1 and len(acc._schedulers) == 1
    assert len(acc._optimizers) == 1
    assert acc.prepare_optimizer(first[1]) is first[1]
    assert acc.prepare_scheduler(first[3]) is first[3]


def test_device_map_model_in_one_process_is_not_moved_or_refused() -> None:
    acc = Accelerator()
    model = _MappedModel({"layer.weight": "cpu", "layer.bias": "disk"})
    assert acc.prepare(model) is model


def test_quantized_model_on_another_device_is_refused() -> None:
    acc = Accelerator()
    model = _MappedModel({"": "meta"}, quantized=True)
    with pytest.raises(
        ValueError,
        match=r"loaded in 8-bit or 4-bit precision on a different device than the one you're training on \(cpu\)",
    ):
        acc.prepare(model)


def test_quantized_model_with_cpu_offload_is_refused() -> None:
    acc = Accelerator()
    model = _MappedModel({"a": "cpu"}, quantized=True)
    with pytest.raises(ValueError, match=r"8-bit or 4-bit precision with CPU or disk offload"):
        acc.prepare(model)


def test_evaluation_mode_and_unwrap_in_one_process() -> None:
    acc = Accelerator()
    net = torch.nn.Linear(2, 1)
    assert acc.prepare_model(net, evaluation_mode=True) is net
    assert acc.unwrap_model(net) is net


def test_free_memory_drops_references() -> None:
    acc = Accelerator()
    net, opt, loader, sched = _objects()
    prepared = acc.prepare(net, opt, loader, sched)
    assert acc.free_memory(*prepared) == [None, None, None, None]
    assert (acc._models, acc._optimizers, acc._dataloaders, acc._schedulers) == ([], [], [], [])


DDP_WORKER = """
import json, os, sys
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from accel import Accelerator, DistributedDataParallelKwargs

out = {}
acc = Accelerator()
rank = acc.process_index

# Each rank builds different weights: DDP must broadcast rank 0's.
torch.manual_seed(100 + rank)
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
mine = [p.detach().clone() for p in net.parameters()]
opt = torch.optim.SGD(net.parameters(), lr=0.1)
model, p_opt = acc.prepare(net, opt)
out["wrapped"] = isinstance(model, DDP)
out["unwrap_is_user_module"] = acc.unwrap_model(model) is net
out["module_is_user_module"] = model.module is net
out["gradient_as_bucket_view"] = model.gradient_as_bucket_view
out["find_unused"] = model.find_unused_parameters
out["weights_rank0"] = [w.flatten().tolist() for w in acc.broadcast([p.detach().clone() for p in net.parameters()])]
out["weights_mine_before"] = [w.flatten().tolist() for w in mine]
out["weights_after"] = [p.detach().flatten().tolist() for p in net.parameters()]
out["prepared_again"] = acc.prepare(model) is model
out["eval_mode_wrapped"] = isinstance(acc.prepare_model(torch.nn.Linear(2, 2), evaluation_mode=True), DDP)
frozen = torch.nn.Linear(2, 2).requires_grad_(False)
out["frozen_wrapped"] = isinstance(acc.prepare(frozen), DDP)

# Kwargs handlers reach DDP, and the fp16 compression hook really compresses.
acc2 = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
    gradient_as_bucket_view=False, find_unused_parameters=True, bucket_cap_mb=1, comm_hook="fp16")])
lin = torch.nn.Linear(1, 1, bias=False)
torch.nn.init.ones_(lin.weight)
m2 = acc2.prepare(lin)
out["kw_gradient_as_bucket_view"] = m2.gradient_as_bucket_view
out["kw_find_unused"] = m2.find_unused_parameters
out["kw_bucket_bytes_cap"] = m2.bucket_bytes_cap
out["kw_hook_is_fp16"] = m2._comm_hooks[0][0] is default_hooks.fp16_compress_hook
x = torch.tensor([[1.0 / 3.0 + 0.001 * rank]])
m2(x).sum().backward()
out["fp16_hook_grad"] = lin.weight.grad.item()

# Device-map models are refused in distributed mode, with Accelerate's messages.
class Mapped(torch.nn.Module):
    def __init__(self, device_map, quantized=False):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.hf_device_map = device_map
        self.is_loaded_in_8bit = quantized

errors = {}
for name, model_ in (("device_map", Mapped({"a": "cpu", "b": "disk"})), ("quantized", Mapped({"a": 0, "b": 1}, True))):
    try:
        acc.prepare(model_)
        errors[name] = None
    except ValueError as exc:
        errors[name] = str(exc)
out["errors"] = errors
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
"""


def test_ddp_prepare_on_two_processes(write_script, tmp_path: Path) -> None:
    launch(write_script(DDP_WORKER), str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for out in reports:
        assert out["wrapped"] is True
        assert out["unwrap_is_user_module"] is True and out["module_is_user_module"] is True
        assert out["gradient_as_bucket_view"] is True  # our default, measured faster
        assert out["find_unused"] is False
        assert out["prepared_again"] is True
        assert out["eval_mode_wrapped"] is False
        assert out["frozen_wrapped"] is False
        # DDP broadcast rank 0's weights: every rank now holds exactly rank 0's initial ones.
        assert out["weights_after"] == reports[0]["weights_mine_before"]
        assert out["weights_after"] == out["weights_rank0"]
        assert out["kw_gradient_as_bucket_view"] is False
        assert out["kw_find_unused"] is True
        assert out["kw_bucket_bytes_cap"] == 1024 * 1024
        assert out["kw_hook_is_fp16"] is True
        assert out["errors"]["device_map"] == (
            "You can't train a model that has been loaded with `device_map='auto'` in any distributed mode. "
            "Please rerun your script specifying `--num-processes 1` or by launching with `python {myscript.py}`."
        )
        assert out["errors"]["quantized"].startswith(
            "You can't train a model that has been loaded in 8-bit or 4-bit precision on multiple devices in any "
            "distributed mode."
        )
    assert reports[1]["weights_mine_before"] != reports[0]["weights_mine_before"]  # the broadcast did something
    # The gradient of w*x w.r.t. w is x: averaged across ranks, in fp16 by the compression hook.
    grads = torch.tensor([1.0 / 3.0, 1.0 / 3.0 + 0.001])
    fp16_mean = (grads.half() / 2).sum().float().item()
    assert fp16_mean != pytest.approx(grads.mean().item(), abs=1e-6)  # the reference tells the two apart
    assert reports[0]["fp16_hook_grad"] == reports[1]["fp16_hook_grad"] == fp16_mean
