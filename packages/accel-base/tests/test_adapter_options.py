"""The options base every adapter declares its settings with (`accel.adapter.options`), and the
base `Adapter`'s defaults built on it: options parsed into `config`, launch flags, and device
calls forwarded to the vendor module."""

from __future__ import annotations

import argparse
import sys
import types
from dataclasses import dataclass
from typing import ClassVar

import pytest
from accel.adapter.base import Adapter
from accel.adapter.options import AdapterOptions, AdapterOptionsError, option
from accel.errors import AccelError


@dataclass(kw_only=True, frozen=True)
class DemoOptions(AdapterOptions):
    label: ClassVar[str] = "Demo"

    fused: bool = option(False, env="ACCEL_DEMO_FUSED", flag="--demo-fused", help="demo: fused kernels")
    prefetch: bool = option(True, env="ACCEL_DEMO_PREFETCH", flag="--demo-prefetch", help="demo: prefetch")
    prepack: bool | None = option(None, env="ACCEL_DEMO_PREPACK", flag="--demo-prepack", help="demo: prepack")
    mode: str = option("fast", env="ACCEL_DEMO_MODE", flag="--demo-mode", choices=("fast", "Exact"), help="m")
    workers: int | None = option(None, env="ACCEL_DEMO_WORKERS", flag="--demo-workers", minimum=1, help="w")
    ratio: float = option(0.5, env="ACCEL_DEMO_RATIO")


@dataclass(kw_only=True, frozen=True)
class PairedOptions(AdapterOptions):
    device: str | None = option(None, env="DEMO_DEVICE", flag="--demo-device", choices=("A", "B"))
    count: int | None = option(None, env="DEMO_COUNT", flag="--demo-count")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.count is not None and self.device != "B":
            raise AdapterOptionsError("--demo-count needs --demo-device B")


def _parser(options: type[AdapterOptions] = DemoOptions) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    options.add_launch_arguments(parser.add_argument_group("demo"))
    return parser


# ---- parsing the environment ---------------------------------------------------------------------
def test_defaults_without_variables() -> None:
    assert DemoOptions.from_env({}) == DemoOptions(
        fused=False, prefetch=True, prepack=None, mode="fast", workers=None, ratio=0.5
    )


def test_every_kind_parses_from_its_variable() -> None:
    env = {
        "ACCEL_DEMO_FUSED": " Yes ",
        "ACCEL_DEMO_PREFETCH": "off",
        "ACCEL_DEMO_PREPACK": "TRUE",
        "ACCEL_DEMO_MODE": "EXACT",
        "ACCEL_DEMO_WORKERS": "4",
        "ACCEL_DEMO_RATIO": "0.25",
        "UNRELATED": "x",
    }
    assert DemoOptions.from_env(env) == DemoOptions(
        fused=True, prefetch=False, prepack=True, mode="Exact", workers=4, ratio=0.25
    )
    assert DemoOptions.from_env({"ACCEL_DEMO_PREPACK": "auto"}).prepack is None
    assert DemoOptions.from_env({"ACCEL_DEMO_PREPACK": "0"}).prepack is False


@pytest.mark.parametrize(
    "var", ["ACCEL_DEMO_FUSED", "ACCEL_DEMO_PREFETCH", "ACCEL_DEMO_PREPACK", "ACCEL_DEMO_MODE", "ACCEL_DEMO_WORKERS"]
)
@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_counts_as_unset(var: str, empty: str) -> None:
    assert DemoOptions.from_env({var: empty}) == DemoOptions()


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_DEMO_WORKERS", "3")
    assert DemoOptions.from_env().workers == 3


def test_overrides_win_over_variables() -> None:
    options = DemoOptions.from_env({"ACCEL_DEMO_FUSED": "1", "ACCEL_DEMO_MODE": "fast"}, overrides={"fused": False})
    assert options.fused is False and options.mode == "fast"
    assert DemoOptions.from_env({}, overrides={"mode": "exact"}).mode == "Exact"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ACCEL_DEMO_FUSED": "maybe"}, "ACCEL_DEMO_FUSED='maybe' is not a boolean; set it to 1 or 0."),
        ({"ACCEL_DEMO_PREPACK": "2"}, "ACCEL_DEMO_PREPACK='2' is not a boolean; set it to auto, 1 or 0."),
        ({"ACCEL_DEMO_WORKERS": "two"}, "ACCEL_DEMO_WORKERS='two' is not a whole number; set it to a whole number."),
        ({"ACCEL_DEMO_WORKERS": "0"}, "workers must be at least 1, got 0 (from --demo-workers or ACCEL_DEMO_WORKERS)"),
        ({"ACCEL_DEMO_MODE": "slow"}, "mode must be one of ('fast', 'Exact'), got 'slow' (from --demo-mode or"),
    ],
)
def test_bad_variables_say_what_to_set(env: dict[str, str], message: str) -> None:
    with pytest.raises(AdapterOptionsError) as info:
        DemoOptions.from_env(env)
    assert message in str(info.value)
    assert isinstance(info.value, AccelError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fused": "yes"}, "fused must be True or False, got 'yes'"),
        ({"workers": True}, "workers must be a whole number, got True"),
        ({"prefetch": None}, "prefetch must be set, got None"),
        ({"ratio": "big"}, "ratio must be a number, got 'big' (from ACCEL_DEMO_RATIO)"),
    ],
)
def test_values_from_code_are_checked_too(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(AdapterOptionsError) as info:
        DemoOptions.from_env({}, overrides=overrides)
    assert message in str(info.value)
    assert DemoOptions.from_env({}, overrides={"ratio": 2}).ratio == 2


def test_unknown_overrides_are_refused_with_the_list_of_options() -> None:
    with pytest.raises(AdapterOptionsError) as info:
        DemoOptions.from_env({}, overrides={"fusd": True, "fused": True})
    assert str(info.value) == (
        "Unknown Demo adapter option(s) ['fusd']; the options are "
        "['fused', 'mode', 'prefetch', 'prepack', 'ratio', 'workers']."
    )


def test_a_field_of_an_unsupported_type_is_a_declaration_error() -> None:
    @dataclass(kw_only=True, frozen=True)
    class Broken(AdapterOptions):
        names: list = option(None, env="X")  # type: ignore[type-arg]  # noqa: RUF009

    with pytest.raises(TypeError, match="names: an option is bool, int, float or str"):
        Broken.from_env({})


# ---- launch flags ------------------------------------------------------------------------------
def test_flags_become_the_variables_that_parse_back() -> None:
    args = _parser().parse_args(
        ["--demo-fused", "--no-demo-prefetch", "--demo-prepack", "OFF", "--demo-mode", "exact", "--demo-workers", "2"]
    )
    env = DemoOptions.launch_env(args)
    assert env == {
        "ACCEL_DEMO_FUSED": "1",
        "ACCEL_DEMO_PREFETCH": "0",
        "ACCEL_DEMO_PREPACK": "0",
        "ACCEL_DEMO_MODE": "Exact",
        "ACCEL_DEMO_WORKERS": "2",
    }
    assert DemoOptions.from_env(env) == DemoOptions(fused=True, prefetch=False, prepack=False, mode="Exact", workers=2)
    auto = DemoOptions.launch_env(_parser().parse_args(["--demo-prepack", "auto"]))
    assert auto == {"ACCEL_DEMO_PREPACK": "auto"} and DemoOptions.from_env(auto).prepack is None


def test_no_flags_set_no_variables() -> None:
    assert DemoOptions.launch_env(_parser().parse_args([])) == {}
    # A parser without this adapter's flags (another adapter selected) sets nothing either.
    assert DemoOptions.launch_env(argparse.Namespace()) == {}


def test_only_options_with_a_flag_get_one() -> None:
    flags = {opt for action in _parser()._actions for opt in action.option_strings}
    assert flags == {
        "-h",
        "--help",
        "--demo-fused",
        "--no-demo-fused",
        "--demo-prefetch",
        "--no-demo-prefetch",
        "--demo-prepack",
        "--demo-mode",
        "--demo-workers",
    }


@pytest.mark.parametrize("argv", [["--demo-mode", "slow"], ["--demo-prepack", "maybe"], ["--demo-workers", "x"]])
def test_bad_flag_values_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert "invalid" in capsys.readouterr().err


def test_rules_between_options_hold_at_launch() -> None:
    parser = _parser(PairedOptions)
    assert PairedOptions.launch_env(parser.parse_args(["--demo-device", "b", "--demo-count", "2"])) == {
        "DEMO_DEVICE": "B",
        "DEMO_COUNT": "2",
    }
    with pytest.raises(AdapterOptionsError, match="--demo-count needs --demo-device B"):
        PairedOptions.launch_env(parser.parse_args(["--demo-device", "A", "--demo-count", "2"]))
    with pytest.raises(AdapterOptionsError, match="the options are \\['count', 'device'\\]"):
        PairedOptions.from_env({}, overrides={"x": 1})


# ---- the base Adapter on top of it ---------------------------------------------------------------
class DemoAdapter(Adapter):
    name: ClassVar[str] = "demo-options"
    options_class: ClassVar[type[DemoOptions]] = DemoOptions


def test_adapter_parses_its_options_class_into_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_DEMO_FUSED", "1")
    monkeypatch.setenv("ACCEL_DEMO_MODE", "exact")
    adapter = DemoAdapter(options={"mode": "fast"})
    assert adapter.config == DemoOptions(fused=True, mode="fast")
    with pytest.raises(AdapterOptionsError, match=r"Unknown Demo adapter option\(s\) \['speed'\]"):
        DemoAdapter(options={"speed": 1})


def test_adapter_launch_flags_come_from_its_options_class() -> None:
    parser = argparse.ArgumentParser()
    DemoAdapter.add_launch_arguments(parser.add_argument_group("demo"))
    assert DemoAdapter.launch_env(parser.parse_args(["--demo-fused"])) == {"ACCEL_DEMO_FUSED": "1"}
    plain = argparse.ArgumentParser()
    Adapter.add_launch_arguments(plain.add_argument_group("base"))
    assert len(plain._actions) == 1  # only --help
    assert Adapter.launch_env(plain.parse_args([])) == {}


def test_an_adapter_without_options_refuses_them() -> None:
    assert Adapter().config is None
    with pytest.raises(AdapterOptionsError, match="adapter takes no options"):
        Adapter(options={"fused": True})


# ---- vendor forwarding defaults ------------------------------------------------------------------
@pytest.fixture
def vendor(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A vendor module with the documented device calls, recording them."""
    module = types.ModuleType("demo_vendor")
    module.calls = []  # type: ignore[attr-defined]
    module.get_rng_state = lambda: ["device-state", len(module.calls)]  # type: ignore[attr-defined]
    module.set_rng_state = lambda state: module.calls.append(("set_rng_state", state))  # type: ignore[attr-defined]
    module.manual_seed = lambda seed: module.calls.append(("manual_seed", seed))  # type: ignore[attr-defined]
    module.empty_cache = lambda: module.calls.append(("empty_cache",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "demo_vendor", module)
    monkeypatch.setitem(sys.modules, "demo_vendor_bare", types.ModuleType("demo_vendor_bare"))
    return module


class VendorAdapter(Adapter):
    name: ClassVar[str] = "demo-vendor"
    vendor_module: ClassVar[str] = "demo_vendor"
    emulated_vendor_module: ClassVar[str] = "demo_vendor_bare"


def test_device_calls_forward_to_the_vendor_module(vendor: types.ModuleType) -> None:
    adapter = VendorAdapter()
    assert adapter.get_device_rng_state() == ["device-state", 0]
    state = adapter.get_rng_state()
    assert state["device"] == ["device-state", 0]
    adapter.set_rng_state(state)
    adapter.manual_seed(7)
    adapter.empty_cache()
    adapter.set_device_rng_state(None)  # nothing saved for the device: nothing to restore
    assert vendor.calls == [("set_rng_state", ["device-state", 0]), ("manual_seed", 7), ("empty_cache",)]


def test_a_vendor_module_without_the_calls_or_no_vendor_module_is_a_no_op(vendor: types.ModuleType) -> None:
    for adapter in (VendorAdapter(emulate=True), Adapter()):  # the stand-in has none of the functions
        assert adapter.get_device_rng_state() is None and adapter.get_rng_state()["device"] is None
        adapter.set_device_rng_state(["x"])
        adapter.manual_seed(1)
        adapter.empty_cache()
    assert vendor.calls == []
