"""Replicate-only `ParallelismConfig`s (`ParallelismConfig()`, `dp_replicate_size=N` alone, the launcher's
`--use_parallelism_config` without sizes) run as plain data parallelism (DDP), as in Accelerate 1.15; checked on
2 gloo processes against a one-process reference, and their sizes and refusals against Accelerate's own class."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from accel.adapter.cpu import CPUAdapter
from accel.strategies.ddp import DDPStrategy
from accel.strategies.fsdp import FSDP2Strategy
from accel.strategies.parallelism_config import MeshFacts, ParallelismConfig, with_parallelism
from conftest import launch

WORKER = r"""
import torch
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator, FSDPConfig, set_seed
from accel.strategies.parallelism_config import ParallelismConfig
from accel.state import AcceleratorState, GradientState

def batch(step):
    g = torch.Generator().manual_seed(10 + step)
    return torch.randn(8, 5, generator=g), torch.randn(8, 2, generator=g)

def reference():
    set_seed(0)
    model = torch.nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(3):
        x, y = batch(s)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step(); opt.zero_grad()
    return model.weight.detach().clone()

def fresh():
    AcceleratorState._reset_state(); GradientState._reset_state()

def ddp_run(name, pc):
    fresh()
    acc = Accelerator() if pc == "launcher" else Accelerator(parallelism_config=pc)
    assert acc.strategy.name == "ddp", (name, acc.strategy.name)
    assert str(acc.distributed_type).endswith("MULTI_CPU"), acc.distributed_type
    assert not acc.is_fsdp2
    got = acc.parallelism_config
    assert isinstance(got, ParallelismConfig) and got.dp_replicate_size == 2 and got.total_size == 2, got
    mesh = acc.torch_device_mesh
    assert mesh.mesh_dim_names == ("dp_replicate",) and mesh.device_type == acc.device.type, mesh
    assert acc.data_parallel_rank == acc.process_index == mesh.get_local_rank("dp_replicate")
    set_seed(0)
    model = torch.nn.Linear(5, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    assert type(model).__name__ == "DistributedDataParallel", type(model)
    for s in range(3):
        x, y = batch(s)
        sl = slice(acc.process_index * 4, (acc.process_index + 1) * 4)
        acc.backward(torch.nn.functional.mse_loss(model(x[sl]), y[sl]))
        opt.step(); opt.zero_grad()
    w = acc.unwrap_model(model).weight.detach()
    assert torch.allclose(w, reference(), atol=1e-6), (name, (w - reference()).abs().max())
    data = torch.arange(10.0)
    dl = acc.prepare(DataLoader(TensorDataset(data), batch_size=2))
    got = torch.cat([acc.gather_for_metrics(x) for (x,) in dl])
    assert sorted(got.tolist()) == data.tolist(), got
    acc.print(f"OK {name}")

def refused(name, make, message):
    fresh()
    try:
        make()
    except ValueError as e:
        assert message in str(e), (name, str(e))
        print(f"OK {name}")
        return
    raise AssertionError(f"{name}: no ValueError")

# The launcher ran this with `--use_parallelism_config` and no sizes: Accelerate runs DDP.
ddp_run("launcher", "launcher")
ddp_run("empty", ParallelismConfig())
ddp_run("replicate2", ParallelismConfig(dp_replicate_size=2))
refused(
    "replicate3",
    lambda: Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=3)),
    "ParallelismConfig total_size (3) does not match num_processes (2)",
)
refused(
    "fsdp_plugin",
    lambda: Accelerator(parallelism_config=ParallelismConfig(), fsdp_plugin=FSDPConfig()),
    "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across",
)
"""


def test_replicate_only_configs_run_as_ddp_on_two_processes(write_script, tmp_path):
    proc = launch(write_script(WORKER), launch_args=("--use_parallelism_config",), timeout=300)
    for name in ("launcher", "empty", "replicate2", "replicate3", "fsdp_plugin"):
        assert f"OK {name}" in proc.stdout, (name, proc.stdout)


# ---- the same sizes and refusals as Accelerate's own class ---------------------------------------------
CASES = [
    # (ParallelismConfig kwargs, number of processes, FSDP plugin given)
    ({}, 1, False),
    ({}, 2, False),
    ({}, 4, False),
    ({"dp_replicate_size": 2}, 2, False),
    ({"dp_replicate_size": 3}, 2, False),
    ({"dp_replicate_size": 2}, 4, False),
    ({}, 2, True),
    ({"dp_replicate_size": 2}, 2, True),
    ({"dp_shard_size": 2}, 2, True),
    ({"dp_shard_size": 2}, 4, True),
    ({"dp_replicate_size": 2, "dp_shard_size": 2}, 4, True),
    ({"dp_shard_size": 2, "tp_size": 2}, 4, False),
    ({"tp_size": 0}, 1, False),
    ({"dp_replicate_size": 2, "tp_size": 2}, 4, False),
    ({"cp_size": 2, "sp_size": 2}, 4, False),
]
# Not compared: tp_size alone with the FSDP plugin. Accelerate refuses it ("no dimension for FSDP to shard
# across": its model must arrive tensor-parallel already); accel applies the plan itself on the fsdp2 strategy.


def _outcome(run: object) -> tuple[str, object]:
    try:
        return "ok", run()
    except ValueError as e:
        return "ValueError", str(e).split(". ")[0]


def _accelerate_sizes(kwargs: dict, n: int, fsdp: bool) -> tuple[str, object]:
    from accelerate.parallelism_config import ParallelismConfig as AccelerateConfig
    from accelerate.utils import DistributedType

    def run() -> dict:
        pc = AccelerateConfig(**kwargs)
        fake = SimpleNamespace(
            multi_device=n > 1,
            num_processes=n,
            is_fsdp2=fsdp,
            distributed_type=DistributedType.FSDP if fsdp else DistributedType.MULTI_CPU,
            is_main_process=True,
        )
        pc._validate_accelerator(fake)
        return dict(pc._sizes)

    return _outcome(run)


def _accel_sizes(kwargs: dict, n: int, fsdp: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[str, object]:
    from accel.strategies.parallelism_config import bind_parallelism

    def run() -> dict:
        pc = ParallelismConfig(**kwargs)
        monkeypatch.setattr(pc, "get_device_mesh", lambda device_type: f"mesh on {device_type}")
        name, config = with_parallelism(pc, "fsdp2" if fsdp else None, None)
        strategy = FSDP2Strategy(config) if name == "fsdp2" else DDPStrategy()
        state = SimpleNamespace(
            num_processes=n,
            use_distributed=n > 1,
            device=SimpleNamespace(type="cpu"),
            adapter=CPUAdapter(),
            backend="gloo",
            mixed_precision="no",
        )
        bind_parallelism(strategy, pc, state)
        assert strategy.parallelism is pc
        return dict(pc._sizes)

    return _outcome(run)


@pytest.mark.parametrize(("kwargs", "n", "fsdp"), CASES)
def test_sizes_and_refusals_match_accelerate(kwargs, n, fsdp, monkeypatch):
    pytest.importorskip("accelerate", reason="needs accelerate==1.15.0 (nox -s compat installs it)")
    for name in ("PARALLELISM_CONFIG_TP_SIZE", "ACCEL_PARALLELISM_TP_SIZE", "ACCEL_PARALLELISM_DP_SHARD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    expected = _accelerate_sizes(kwargs, n, fsdp)
    got = _accel_sizes(kwargs, n, fsdp, monkeypatch)
    assert got == expected


def test_replicate_only_config_on_fsdp2_is_refused_on_several_processes():
    # Accelerate's refusal (the FSDP plugin with nothing to shard), without needing accelerate installed.
    strategy = FSDP2Strategy(ParallelismConfig(dp_replicate_size=2))
    facts = MeshFacts(
        num_processes=2,
        use_distributed=True,
        device_type="cpu",
        capabilities=CPUAdapter.capabilities,
        adapter_name="cpu",
    )
    with pytest.raises(ValueError, match=r"no dimension for FSDP to shard across.*Drop the fsdp_plugin"):
        strategy.build_mesh(facts)
