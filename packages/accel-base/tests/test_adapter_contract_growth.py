"""Contract hooks a real device needs: the process-group hook and options, a failing vendor import
named with its adapter, and a broken plugin reported instead of silently skipped."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import torch
from accel.adapter import registry
from accel.adapter.cpu import CPUAdapter
from accel.errors import AccelError, AdapterUnavailableError
from conftest import launch


def test_a_vendor_module_that_fails_to_import_names_the_adapter() -> None:
    class Broken(CPUAdapter):
        name = "brokenvendor"
        vendor_module = "accel_no_such_vendor_module"

    with pytest.raises(
        AdapterUnavailableError,
        match=r"'brokenvendor' adapter cannot load its vendor module "
        r"'accel_no_such_vendor_module': ModuleNotFoundError",
    ) as info:
        Broken().vendor  # noqa: B018
    assert isinstance(info.value, AccelError)


def test_a_broken_plugin_is_reported_once(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_WARNED", set())
    monkeypatch.setenv(registry.REPORTED_VARIABLE, "")  # restored afterwards: reporting sets it
    assert "broken" in registry.broken_adapters()  # the test plugins ship one that fails to import
    with caplog.at_level(logging.WARNING, logger="accel"):
        assert registry.select_adapter() is CPUAdapter
        registry.select_adapter()
    reports = [r.getMessage() for r in caplog.records if "failed to load and were skipped" in r.getMessage()]
    assert len(reports) == 1 and "'broken'" in reports[0] and "using 'cpu'" in reports[0]


BROKEN_WORKER = """
from accel import Accelerator
acc = Accelerator()
print(f"rank {acc.process_index} runs on {acc.adapter.name}", flush=True)
"""


def test_accel_launch_reports_a_broken_plugin_in_one_line(write_script: Any, tmp_path: Any) -> None:
    """The launcher says it once; the workers it starts inherit that it did and stay quiet."""
    dist_info = tmp_path / "plugins" / "accel_brokenx-0.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: accel-brokenx\nVersion: 0.0\n")
    (dist_info / "entry_points.txt").write_text("[accel.adapter]\nbrokenx = accel_no_such_module_xyz:Adapter\n")
    path = os.pathsep.join(p for p in (str(dist_info.parent), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, registry.REPORTED_VARIABLE: ""}
    proc = launch(write_script(BROKEN_WORKER), env=env, timeout=120)
    assert "rank 0 runs on" in proc.stdout and "rank 1 runs on" in proc.stdout, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "'brokenx'" in line]
    assert len(lines) == 1, proc.stderr
    assert "failed to load and were skipped" in lines[0] and "No module named 'accel_no_such_module_xyz'" in lines[0]


def test_only_a_launched_child_of_the_reporter_stays_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(registry.REPORTED_VARIABLE, f"{os.getppid()}:broken,brokenx")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert registry._reported_by_launcher() == set()  # not a launched worker: says it itself
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert registry._reported_by_launcher() == {"broken", "brokenx"}
    monkeypatch.setenv(registry.REPORTED_VARIABLE, f"{os.getpid()}:broken")  # reported by someone else
    assert registry._reported_by_launcher() == set()


HOOKED = """
import torch.distributed as dist
from accel.adapter.cpu import CPUAdapter
calls = []
CPUAdapter.before_process_group = lambda self, device: calls.append(("before", dist.is_initialized(), str(device)))
def options(self, device):
    calls.append(("options", dist.is_initialized()))
    return {"group_name": "accel-test-group"}
CPUAdapter.process_group_options = options
real_init = dist.init_process_group
def init(*args, **kwargs):  # what the core passes to torch (group_name itself leaves no trace in the group)
    calls.append(("init", args[0], kwargs.get("group_name"), kwargs["world_size"]))
    return real_init(*args, **kwargs)
dist.init_process_group = init
from accel import Accelerator
acc = Accelerator()
print(f"rank {acc.process_index}: {calls} {dist.is_initialized()}", flush=True)
"""


def test_the_process_group_hook_runs_first_and_its_options_reach_init(write_script: Any) -> None:
    proc = launch(write_script(HOOKED), timeout=120)
    for rank in (0, 1):
        expected = "[('before', False, 'cpu'), ('options', False), ('init', 'gloo', 'accel-test-group', 2)] True"
        assert f"rank {rank}: {expected}" in proc.stdout, proc.stdout


def test_options_default_to_none() -> None:
    assert CPUAdapter().process_group_options(torch.device("cpu")) == {}
