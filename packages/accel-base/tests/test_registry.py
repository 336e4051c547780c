"""Adapter discovery through real entry points, selection order, emulation and failure isolation.

The `accel-test-plugins` distribution (tests/plugins) is installed in the test venv and
registers `fakedev` (priority 50, available only with ACCEL_TEST_FAKEDEV=1), `absent`
(priority 100, never available), `broken` (fails at import) and `notanadapter`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from collections.abc import Iterator
from typing import ClassVar

import pytest
import torch
from accel import Accelerator, AdapterNotFoundError, AdapterUnavailableError
from accel.adapter import registry
from accel.adapter.base import ADAPTER_API_VERSION, Adapter, Availability
from accel.adapter.cpu import CPUAdapter
from accel.state import AcceleratorState

# Other adapter packages of this repository may be installed too: read the names from the
# installed distributions' metadata, leaving out the two test entry points that cannot load.
INSTALLED = ", ".join(
    sorted({ep.name for ep in importlib.metadata.entry_points(group="accel.adapter")} - {"broken", "notanadapter"})
)


@pytest.fixture(autouse=True)
def _clean_selection_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ACCEL_ADAPTER", "ACCEL_EMULATE", "ACCEL_TEST_FAKEDEV", "ACCEL_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fakedev_calls() -> Iterator[dict[str, int]]:
    emulated = importlib.import_module("accel_test_plugins.fakedev_emulated")
    emulated.calls["mark_step"] = 0
    yield emulated.calls
    emulated.calls["mark_step"] = 0


# ---- discovery --------------------------------------------------------------------------
def test_plugins_are_found_through_their_entry_points() -> None:
    records = registry.adapter_records()
    assert {"cpu", "fakedev", "absent", "broken", "notanadapter"} <= set(records)
    fake = records["fakedev"]
    assert fake.ok and fake.distribution == "accel-test-plugins"
    assert fake.value == "accel_test_plugins.fakedev:FakeDeviceAdapter"
    assert fake.loaded.__module__ == "accel_test_plugins.fakedev"
    assert records["cpu"].loaded is CPUAdapter
    assert {"absent", "cpu", "fakedev"} <= set(INSTALLED.split(", "))
    assert sorted(registry.installed_adapters()) == INSTALLED.split(", ")


def test_discovery_does_not_import_vendor_modules() -> None:
    # The real fakedev vendor module raises at import: had discovery imported it, fakedev would be broken.
    assert registry.adapter_records()["fakedev"].ok
    assert "accel_test_plugins.fakedev_vendor" not in sys.modules


def test_broken_plugins_are_reported_by_name_and_skipped() -> None:
    broken = registry.broken_adapters()
    assert broken["broken"] == "ModuleNotFoundError: No module named 'accel_missing_vendor_sdk'"
    assert broken["notanadapter"] == "accel_test_plugins.absent:NotAnAdapter is not a subclass of accel.adapter.Adapter"
    # The others still work.
    assert registry.select_adapter() is CPUAdapter
    with pytest.raises(
        AdapterNotFoundError,
        match=r"'broken' \(from accel-test-plugins, .*\) failed to load: .*accel_missing_vendor_sdk",
    ):
        Accelerator(adapter="broken")


# ---- selection ----------------------------------------------------------------------------
def test_priority_picks_fakedev_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.select_adapter() is CPUAdapter  # fakedev unavailable, absent (priority 100) never available
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "1")
    chosen = registry.select_adapter()
    assert chosen.name == "fakedev" and chosen.priority == 50
    # A higher-priority adapter that is unavailable is passed over, not chosen.
    assert registry.installed_adapters()["absent"].priority > chosen.priority


def test_auto_selected_fakedev_runs_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "1")
    monkeypatch.setenv("ACCEL_EMULATE", "1")
    acc = Accelerator()
    assert acc.adapter.name == "fakedev"
    assert acc.adapter.emulate is True


def test_argument_beats_environment_beats_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "1")
    monkeypatch.setenv("ACCEL_EMULATE", "1")
    monkeypatch.setenv("ACCEL_ADAPTER", "cpu")
    assert Accelerator().adapter.name == "cpu"  # environment beats priority
    AcceleratorState._reset_state(reset_partial_state=True)
    monkeypatch.setenv("ACCEL_ADAPTER", "fakedev")
    assert Accelerator(adapter="cpu").adapter.name == "cpu"  # argument beats environment
    AcceleratorState._reset_state(reset_partial_state=True)
    assert Accelerator().adapter.name == "fakedev"  # environment alone
    AcceleratorState._reset_state(reset_partial_state=True)
    assert Accelerator(cpu=True).adapter.name == "cpu"


def test_unknown_adapter_lists_installed_ones() -> None:
    msg = rf"No accel adapter named 'nope' is installed\. Installed adapters: {INSTALLED}\. Install its package"
    with pytest.raises(AdapterNotFoundError, match=msg):
        Accelerator(adapter="nope")


def test_unknown_adapter_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_ADAPTER", "nope")
    with pytest.raises(AdapterNotFoundError, match=rf"Installed adapters: {INSTALLED}"):
        Accelerator()


def test_unavailable_adapter_says_why_and_mentions_emulation() -> None:
    with pytest.raises(
        AdapterUnavailableError,
        match=r"'absent' is installed but cannot run here: no absentdev driver found\. .*ACCEL_EMULATE=1",
    ):
        Accelerator(adapter="absent")
    with pytest.raises(
        AdapterUnavailableError, match=r"no fakedev device \(set ACCEL_TEST_FAKEDEV=1\).*ACCEL_EMULATE=1"
    ):
        Accelerator(adapter="fakedev")


# ---- emulation ------------------------------------------------------------------------------
def test_emulation_runs_fakedev_on_cpu_with_its_stand_in(
    monkeypatch: pytest.MonkeyPatch, fakedev_calls: dict[str, int]
) -> None:
    monkeypatch.setenv("ACCEL_ADAPTER", "fakedev")
    monkeypatch.setenv("ACCEL_EMULATE", "1")
    acc = Accelerator()
    adapter = acc.adapter
    assert adapter.name == "fakedev" and adapter.emulate
    assert (adapter.device_type, adapter.backend) == ("cpu", "gloo")
    assert (adapter.hardware_device_type, adapter.hardware_backend) == ("fakedev", "fakeccl")
    assert acc.device == torch.device("cpu")
    assert adapter.vendor.__name__ == "accel_test_plugins.fakedev_emulated"
    assert "emulated on cpu" in adapter.describe()

    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert model._fakedev_prepared is True  # the adapter's own prepare ran
    loss = model(torch.ones(2, 3)).sum()
    acc.backward(loss)
    assert fakedev_calls["mark_step"] == 1  # after backward
    opt.step()
    assert fakedev_calls["mark_step"] == 2  # after the optimizer step
    opt.zero_grad()
    with acc.accumulate(model):
        pass
    assert fakedev_calls["mark_step"] == 2  # nothing else marks steps


def test_without_emulation_the_real_vendor_module_is_used() -> None:
    adapter = registry.get_adapter_class("fakedev")(emulate=False)
    assert (adapter.device_type, adapter.backend) == ("fakedev", "fakeccl")
    # The vendor stack is absent here: the error names the adapter and keeps the import error.
    with pytest.raises(
        AdapterUnavailableError,
        match=r"'fakedev' adapter cannot load its vendor module .*exists only on fakedev machines",
    ):
        _ = adapter.vendor


def test_emulation_does_not_change_auto_selection_of_unavailable_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_EMULATE", "1")
    assert Accelerator().adapter.name == "cpu"


# ---- plugins installed at run time (the registry caches its entry points) -----------------------
class _FutureAdapter(Adapter):
    name: ClassVar[str] = "future"
    api_version: ClassVar[int] = ADAPTER_API_VERSION + 1


class _VersionOne(Adapter):
    """Built for the first contract: it still implements the hooks version 2 dropped."""

    name: ClassVar[str] = "versionone"
    api_version: ClassVar[int] = 1

    @classmethod
    def availability(cls) -> Availability:
        return Availability(available=False, reason="a test adapter")

    def synchronize(self) -> None:
        pass


class _ProbeRaises(Adapter):
    name: ClassVar[str] = "proberaises"
    priority: ClassVar[int] = 99

    @classmethod
    def availability(cls) -> Availability:
        raise OSError("driver crashed")


class _Second(Adapter):
    name: ClassVar[str] = "fakedev"


@pytest.fixture
def extra_entry_points(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    module = types.ModuleType("accel_runtime_plugins")
    module.Future, module.Probe, module.Second = _FutureAdapter, _ProbeRaises, _Second  # type: ignore[attr-defined]
    module.VersionOne = _VersionOne  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "accel_runtime_plugins", module)
    real = importlib.metadata.entry_points

    def entry_points(**kwargs):  # type: ignore[no-untyped-def]
        found = list(real(**kwargs))
        if kwargs.get("group") == registry.ADAPTER_GROUP:
            found += [
                importlib.metadata.EntryPoint(name=n, value=f"accel_runtime_plugins:{v}", group=registry.ADAPTER_GROUP)
                for n, v in (
                    ("future", "Future"),
                    ("proberaises", "Probe"),
                    ("fakedev", "Second"),
                    ("versionone", "VersionOne"),
                )
            ]
        return found

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry.clear_cache()
    yield
    monkeypatch.undo()
    registry.clear_cache()


def test_registry_caches_until_cleared(extra_entry_points: None) -> None:
    assert "future" in registry.adapter_records()
    registry.clear_cache()
    assert "future" in registry.adapter_records()


def test_adapter_for_another_api_version_is_refused_by_name(extra_entry_points: None) -> None:
    error = registry.broken_adapters()["future"]
    assert error.startswith(
        f"built for adapter API {ADAPTER_API_VERSION + 1}, this accel-base speaks [1, 2, 3] (current 3); upgrade"
    )
    with pytest.raises(AdapterNotFoundError, match=r"'future' .* failed to load: built for adapter API"):
        registry.get_adapter_class("future")


def test_an_adapter_built_for_version_one_still_loads(extra_entry_points: None) -> None:
    assert "versionone" not in registry.broken_adapters()
    assert registry.get_adapter_class("versionone") is _VersionOne


def test_availability_probe_that_raises_means_unavailable(extra_entry_points: None) -> None:
    avail = registry.availability(_ProbeRaises)
    assert not avail and avail.reason == "availability check raised OSError: driver crashed"
    assert registry.select_adapter() is CPUAdapter  # priority 99 but unavailable: skipped, not fatal


def test_first_distribution_keeps_a_contested_name(extra_entry_points: None) -> None:
    assert registry.adapter_records()["fakedev"].distribution == "accel-test-plugins"
    assert registry.get_adapter_class("fakedev") is not _Second
