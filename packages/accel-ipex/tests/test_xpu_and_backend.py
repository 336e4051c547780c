"""The adapter's XPU path on an emulated Intel XPU host (`accel_ipex.ipex_emulated`: real IPEX on the CPU,
`torch.xpu` and the backend probes stood in), and the collective backend Accelerate's IPEX integration chose,
decided by what really imports here and by real environment variables."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.distributed.distributed_type import DistributedType
from accel.errors import SettingError
from accel.utils import set_seed
from accel_ipex import IpexAdapter
from accel_ipex import ipex as real_vendor
from accel_ipex import ipex_emulated as host
from ipex_models import Net, batch
from torch import nn

BINDINGS = "oneccl_bindings_for_pytorch"


@pytest.fixture(autouse=True)
def emulated_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A host without XPUs, with xccl, without mpi, and nothing recorded; no oneCCL bindings imported."""
    for key, value in {"xpus": 0, "xccl": True, "mpi": False}.items():
        monkeypatch.setitem(host.machine, key, value)
    monkeypatch.delenv("CCL_WORKER_COUNT", raising=False)
    host.calls.clear()
    host.current_device.clear()
    real_vendor.ccl_available.cache_clear()
    yield
    real_vendor.ccl_available.cache_clear()
    sys.modules.pop(BINDINGS, None)


@pytest.fixture
def bindings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """oneCCL's bindings importable (they are not on PyPI: a package of that name, which the backend choice
    really imports)."""
    (tmp_path / f"{BINDINGS}.py").write_text("IMPORTED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def on_host(xpus: int, **machine: bool) -> IpexAdapter:
    """The adapter as it runs on the emulated host, off emulation (device and backend as on that hardware)."""
    host.machine.update(xpus=xpus, **machine)
    adapter = IpexAdapter()
    adapter._vendor = host  # the kit's hardware twin does the same
    return adapter


# ---- the CPU backend (I10) ------------------------------------------------------------------------
def test_cpu_backend_is_gloo_without_oneccl_or_mpi() -> None:
    assert not torch.distributed.is_mpi_available()  # pip's torch: no mpi backend
    adapter = IpexAdapter()
    assert adapter.on_xpu is False and adapter.backend == "gloo"


def test_cpu_backend_is_ccl_only_with_worker_threads(bindings: None, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = IpexAdapter()
    assert adapter.backend == "gloo"  # the bindings import, but Accelerate wanted CCL_WORKER_COUNT on CPUs
    assert BINDINGS not in sys.modules
    monkeypatch.setenv("CCL_WORKER_COUNT", "0")
    assert adapter.backend == "gloo"
    monkeypatch.setenv("CCL_WORKER_COUNT", "2")
    assert adapter.backend == "ccl"
    assert sys.modules[BINDINGS].IMPORTED  # imported, which registers `ccl` with torch.distributed


def test_cpu_backend_is_mpi_when_torch_has_it(bindings: None, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = on_host(0, mpi=True)
    assert adapter.backend == "mpi"
    monkeypatch.setenv("CCL_WORKER_COUNT", "1")
    assert adapter.backend == "ccl"  # oneCCL first, as Accelerate
    host.machine["mpi"] = False
    monkeypatch.setenv("CCL_WORKER_COUNT", "0")
    assert adapter.backend == "gloo"


def test_accelerates_ccl_and_xccl_probes(bindings: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel import utils

    assert utils.is_xccl_available() is False  # this torch has no xccl
    assert utils.is_ccl_available() is True  # the bindings are importable (the fixture's)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not Path(p, f"{BINDINGS}.py").exists()])
    assert utils.is_ccl_available() is False


def test_bad_ccl_worker_count_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCL_WORKER_COUNT", "two")
    with pytest.raises(SettingError, match=r"^CCL_WORKER_COUNT: must be a whole number .* got 'two'; set it to"):
        _ = IpexAdapter().backend


# ---- XPU: device, backend, distributed type (I08, I11) ------------------------------------------------
def test_xpu_device_backend_and_distributed_type() -> None:
    adapter = on_host(2)
    assert adapter.on_xpu and adapter.device_type == "xpu"
    assert adapter.device_for(1) == torch.device("xpu", 1)
    assert adapter.data_parallel_type(True) == DistributedType.MULTI_XPU
    assert adapter.data_parallel_type(False) == DistributedType.NO
    assert adapter.backend == "xccl"
    adapter.set_device(torch.device("xpu", 1))
    assert host.current_device == [1]
    adapter.set_device(torch.device("cpu"))  # a CPU device is never made current
    assert host.current_device == [1]
    cpu = on_host(0)
    assert (cpu.device_type, cpu.device_for(1), cpu.data_parallel_type(True)) == (
        "cpu",
        torch.device("cpu"),
        DistributedType.MULTI_CPU,
    )


def test_xpu_backend_without_xccl_is_ccl_when_oneccl_imports(bindings: None) -> None:
    assert on_host(2, xccl=False).backend == "ccl"  # on XPUs no CCL_WORKER_COUNT is needed


def test_xpu_backend_without_xccl_or_oneccl() -> None:
    assert on_host(2, xccl=False, mpi=True).backend == "mpi"
    assert on_host(2, xccl=False, mpi=False).backend == "gloo"


def test_real_torch_here_has_no_xpu_and_no_xccl() -> None:
    assert real_vendor.is_available() is False and real_vendor.device_count() == 0
    assert real_vendor.is_xccl_available() is False
    assert real_vendor.memory_stats() == {}
    real_vendor.empty_cache()  # nothing to release, no error


# ---- XPU: placement before ipex.optimize, RNG, memory (I08, I26) ------------------------------------------
def test_emulated_xpu_run_places_before_optimize_and_uses_the_xpu_rng_and_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(host.machine, "xpus", 2)
    acc = Accelerator(adapter="ipex", emulate=True)
    assert acc.adapter.vendor is importlib.import_module("accel_ipex.ipex_emulated")
    assert acc.adapter.on_xpu and acc.distributed_type == DistributedType.NO and acc.device == torch.device("cpu")

    events: list[str] = []
    to, optimize = nn.Module.to, host.optimize_for_training

    def recording_to(module: nn.Module, *args: object, **kwargs: object) -> nn.Module:
        events.append(f"to {args[0] if args else kwargs}")
        return to(module, *args, **kwargs)

    def recording_optimize(*args: object, **kwargs: object) -> object:
        events.append("ipex.optimize")
        return optimize(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(nn.Module, "to", recording_to)
    monkeypatch.setattr(host, "optimize_for_training", recording_optimize)
    model = Net()
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert events == [f"to {acc.device}", "ipex.optimize"]
    assert type(model.conv).__name__ == "_IPEXConv2d"  # IPEX really optimized it

    set_seed(7)  # seeds every XPU generator (torch.xpu.manual_seed_all)
    expected = torch.rand(3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.rand(3, generator=host.generator(1)), expected)
    acc.save_state(tmp_path / "ckpt")
    after_save = torch.rand(3, generator=host.generator(0))
    torch.rand(5, generator=host.generator(0))
    acc.load_state(tmp_path / "ckpt")  # restores the XPU generators (get_rng_state_all / set_rng_state_all)
    assert torch.equal(torch.rand(3, generator=host.generator(0)), after_save)

    x, y = batch(0)
    acc.backward(nn.functional.mse_loss(model(x), y))
    opt.step()
    assert acc.adapter.memory_stats()["allocated_bytes.all.current"] == 0
    before = host.calls["empty_cache"]
    acc.free_memory()
    assert host.calls["empty_cache"] == before + 1 and host.calls["memory_stats"] == 1
