"""The adapter's multi-process code on 2 gloo processes (emulation), and torch_xla's own
collectives through the `xla` backend on the real CPU device (one replica: on this device
every process is its own world)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

WORKER = """
import json, sys
import torch
from accel import Accelerator
from accel_xla import xla_emulated
sys.path.insert(0, {tests!r})
from xla_helpers import cpu_weights, loader, model, train

acc = Accelerator()
net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
net, opt, dl = acc.prepare(net, opt, loader(n=64, batch_size=8))
calls_after_prepare = dict(xla_emulated.calls)
if {bare}:  # loss.backward() without the accelerator: the step must still average
    for x, y in dl:
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
else:
    train(acc, net, opt, dl, clip={clip})
gathered = acc.gather_for_metrics(torch.arange(5) + 5 * acc.process_index)
acc.wait_for_everyone()
if acc.is_main_process:
    json.dump({{
        "wrapper": type(net).__name__,
        "weights": [w.tolist() for w in cpu_weights(net)],
        "calls": dict(xla_emulated.calls),
        "after_prepare": calls_after_prepare,
        "gathered": gathered.tolist(),
        "steps": len(dl),
    }}, open({out!r}, "w"))
"""


def _reference(clip: float | None) -> list[torch.Tensor]:
    """One process, full batches of 16 (each rank's 8 together): what 2 averaging ranks must equal."""
    sys.path.insert(0, str(Path(__file__).parent))
    from xla_helpers import loader, model, train_plain

    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    train_plain(net, opt, loader(n=64, batch_size=16), clip=clip)
    return [p.detach() for p in net.parameters()]


@pytest.mark.parametrize(("clip", "bare"), [(None, False), (0.3, False), (None, True)])
def test_two_emulated_ranks_equal_one_process_on_the_full_batch(
    clip: float | None,
    bare: bool,
    launch: Callable[..., subprocess.CompletedProcess[str]],
    write_script: Callable[..., Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "result.json"
    script = write_script(WORKER.format(tests=str(Path(__file__).parent), out=str(out), clip=clip, bare=bare))
    launch(script)
    result = json.loads(out.read_text())
    assert result["wrapper"] == "Sequential"  # no DDP: gradients are averaged at the optimizer step
    steps = result["steps"]
    calls = result["calls"]
    assert result["after_prepare"]["broadcast_master_params"] == 1
    assert calls["optimizer_step"] == steps
    assert calls["sync"] - result["after_prepare"].get("sync", 0) >= steps
    if bare:  # xm.optimizer_step's way: averaged at the step
        assert calls["reduce_gradients"] == steps
    else:  # averaged once per step after backward (clipping sees averaged gradients), not again at the step
        assert calls["all_reduce_mean"] == steps
        assert "reduce_gradients" not in calls
    assert result["gathered"] == list(range(10))
    assert calls["barrier"] >= 1  # wait_for_everyone goes through the adapter
    for got, want in zip(result["weights"], _reference(clip)):
        torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)


STRATEGIES_WORKER = """
import json, sys
import torch
from accel import Accelerator
from accel.state import AcceleratorState, GradientState
from accel_xla import xla_emulated
sys.path.insert(0, {tests!r})
from xla_helpers import cpu_weights, loader, model, train

def flat_grads(net):
    return torch.cat([p.grad.reshape(-1) for p in net.parameters()]).tolist()

out = {{}}
acc = Accelerator()
out["strategy"] = acc.strategy.name
net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
net, opt = acc.prepare(net, opt)
# Different data on each rank, so local and averaged gradients differ.
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(acc.process_index))
y = x.sum(dim=1, keepdim=True)
start = xla_emulated.calls["all_reduce_mean"]
with acc.no_sync(net):
    acc.backward(torch.nn.functional.mse_loss(net(x), y))
inside = xla_emulated.calls["all_reduce_mean"] - start
out["no_sync_local_grad"] = flat_grads(net)
acc.backward(torch.nn.functional.mse_loss(net(x), y))
out["no_sync_all_reduces"] = [inside, xla_emulated.calls["all_reduce_mean"] - start]
out["no_sync_grad"] = flat_grads(net)

# rng_types=["xla"]: every rank takes rank 0's XLA seed (Accelerate broadcasts xm.get_rng_state()).
from accel.utils import synchronize_rng_states
xla_emulated.set_rng_state(1000 + acc.process_index)
synchronize_rng_states(["xla"])
out["xla_seed"] = xla_emulated.get_rng_state()

# strategy="ddp", as scripts and config files name it: on XLA that is xla_ddp (no DDP wrapper).
AcceleratorState._reset_state(reset_partial_state=False)
GradientState._reset_state()
acc = Accelerator(strategy="ddp")
net = model()
opt = torch.optim.SGD(net.parameters(), lr=0.05)
net, opt, dl = acc.prepare(net, opt, loader(n=64, batch_size=8))
before = dict(xla_emulated.calls)
train(acc, net, opt, dl, clip=0.3)
out["ddp"] = {{
    "strategy": acc.strategy.name,
    "wrapper": type(net).__name__,
    "weights": [w.tolist() for w in cpu_weights(acc.unwrap_model(net))],
    "steps": len(dl),
    "calls": {{k: v - before.get(k, 0) for k, v in xla_emulated.calls.items() if v != before.get(k, 0)}},
}}
json.dump(out, open({out!r} + f"/rank{{acc.process_index}}.json", "w"))
"""


@pytest.fixture(scope="module")
def strategy_results(launch, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("xla_strategies")
    script = tmp / "worker.py"
    script.write_text(STRATEGIES_WORKER.format(tests=str(Path(__file__).parent), out=str(tmp)))
    launch(script)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_rng_types_xla_gives_every_rank_rank_0s_seed(strategy_results: list[dict]) -> None:
    assert [r["xla_seed"] for r in strategy_results] == [1000, 1000]


def test_no_sync_suppresses_the_xla_ddp_reduction(strategy_results: list[dict]) -> None:
    r0, r1 = strategy_results
    assert [r["strategy"] for r in strategy_results] == ["xla_ddp", "xla_ddp"]  # the adapter's default
    # Nothing averaged inside no_sync; the next synchronising backward averages what accumulated.
    assert [r["no_sync_all_reduces"] for r in strategy_results] == [[0, 1], [0, 1]]
    assert r0["no_sync_local_grad"] != r1["no_sync_local_grad"]
    assert r0["no_sync_grad"] == r1["no_sync_grad"]
    # Two local backwards on each rank, averaged once: (2 g0 + 2 g1) / 2.
    expected = [a + b for a, b in zip(r0["no_sync_local_grad"], r1["no_sync_local_grad"])]
    assert r0["no_sync_grad"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_strategy_ddp_means_xla_ddp_on_xla(strategy_results: list[dict]) -> None:
    ddp = strategy_results[0]["ddp"]
    assert ddp["strategy"] == "xla_ddp"
    assert ddp["wrapper"] != "DistributedDataParallel"
    calls = ddp["calls"]
    # The strategy averaged after each synchronising backward; the optimizer then steps plainly.
    assert calls["all_reduce_mean"] >= ddp["steps"]
    assert strategy_results[1]["ddp"]["weights"] == ddp["weights"]
    for got, want in zip(ddp["weights"], _reference(0.3)):
        torch.testing.assert_close(torch.tensor(got), want, rtol=1e-5, atol=1e-6)


def test_several_processes_on_the_real_cpu_device_are_refused(
    launch: Callable[..., subprocess.CompletedProcess[str]], write_script: Callable[..., Path]
) -> None:
    pytest.importorskip("torch_xla")
    if os.environ.get("PJRT_DEVICE") != "CPU":
        pytest.skip("on TPUs every process has its own chip and the processes form one world")
    script = write_script("from accel import Accelerator\nAccelerator()\n")
    proc = launch(script, launch_args=("--adapter", "xla", "--pjrt-device", "CPU"), check=False)
    assert proc.returncode != 0
    assert "every process is its own world of one replica" in proc.stderr + proc.stdout


XLA_BACKEND = """
import json
import torch, torch.distributed as dist
import torch_xla
from accel_xla import xla
xla.register_backend()
dist.init_process_group("xla", init_method="xla://")
dev = torch_xla.device()
counts = []
for i in range(4):
    # Data from the host: a Python scalar in the graph would make each iteration a new graph.
    t = (torch.arange(6, dtype=torch.float32) + i).to(dev)
    out = torch.empty(6, device=dev)
    dist.all_gather_into_tensor(out, t)
    s = t.clone()
    dist.all_reduce(s)
    b = t.clone()
    dist.broadcast(b, src=0)
    torch_xla.sync()
    assert torch.equal(out.cpu(), t.cpu()) and torch.equal(s.cpu(), t.cpu()) and torch.equal(b.cpu(), t.cpu())
    counts.append(xla.counters()["compilations"])
print(json.dumps({"backend": dist.get_backend(), "counts": counts}))
"""


def test_collectives_run_through_the_xla_backend_and_compile_once(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    script = tmp_path / "xla_backend.py"
    script.write_text(XLA_BACKEND)
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["backend"] == "xla"
    counts = result["counts"]
    # The first iteration compiles; the same collectives on the same shapes never again.
    assert counts == [counts[0]] * 4
