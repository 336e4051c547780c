"""Contract hooks a real device needs: the process-group hook and options, a failing vendor import
named with its adapter, and a broken plugin reported instead of silently skipped."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from accel import registry
from accel.adapters.cpu import CPUAdapter
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
    assert "broken" in registry.broken_adapters()  # the test plugins ship one that fails to import
    with caplog.at_level(logging.WARNING, logger="accel"):
        assert registry.select_adapter() is CPUAdapter
        registry.select_adapter()
    reports = [r.getMessage() for r in caplog.records if "failed to load and were skipped" in r.getMessage()]
    assert len(reports) == 1 and "'broken'" in reports[0] and "using 'cpu'" in reports[0]


HOOKED = """
import torch.distributed as dist
from accel.adapters.cpu import CPUAdapter
calls = []
CPUAdapter.before_process_group = lambda self, device: calls.append(("before", dist.is_initialized(), str(device)))
def options(self, device):
    calls.append(("options", dist.is_initialized()))
    return {"group_name": "accel-test-group"}
CPUAdapter.process_group_options = options
from accel import Accelerator
acc = Accelerator()
print(f"rank {acc.process_index}: {calls} {dist.is_initialized()}", flush=True)
"""


def test_the_process_group_hook_runs_first_and_its_options_reach_init(write_script: Any) -> None:
    proc = launch(write_script(HOOKED), timeout=120)
    for rank in (0, 1):
        assert f"rank {rank}: [('before', False, 'cpu'), ('options', False)] True" in proc.stdout, proc.stdout


def test_options_default_to_none() -> None:
    assert CPUAdapter().process_group_options(torch.device("cpu")) == {}
