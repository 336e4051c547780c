"""Version pairing, CPU-capability detection and options: the decisions made before IPEX runs."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from accel_ipex import IpexAdapter, IpexOptions, IpexVersionError
from accel_ipex.cpu_features import bf16_prepack_supported, choose_weights_prepack, cpu_flags
from accel_ipex.versions import check_pair, installed_ipex_version, minor

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
SKYLAKE_SP = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
SIERRA_FOREST = AVX2 | {"avx_vnni", "avx_ne_convert", "avx_vnni_int8"}


# ---- versions ------------------------------------------------------------------------------------
def test_matching_minor_releases_pass() -> None:
    check_pair("2.8.0+cu128", "2.8.0")
    check_pair("2.8.1", "2.8.10+xpu")
    assert minor("2.8.0+cpu") == "2.8"


def test_mismatch_names_both_versions_and_what_to_install() -> None:
    with pytest.raises(IpexVersionError) as info:
        check_pair("2.9.0", "2.8.0")
    msg = str(info.value)
    assert "intel-extension-for-pytorch 2.8.0 works only with torch 2.8.*" in msg
    assert "torch 2.9.0 is installed" in msg
    assert "pip install 'torch==2.8.*'" in msg
    assert "pip install 'intel-extension-for-pytorch==2.9.*'" in msg
    assert isinstance(info.value, ImportError)


def test_not_a_version_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'nightly' is not a version number"):
        minor("nightly")


def test_this_venv_has_a_matching_pair() -> None:
    version = installed_ipex_version()
    assert version is not None and minor(version) == minor(torch.__version__) == "2.8"


def test_availability_reports_a_mismatch_without_importing_ipex(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel_ipex.adapter as adapter_module

    monkeypatch.setattr(adapter_module, "installed_torch_version", lambda: "2.13.0")
    avail = IpexAdapter.availability()
    assert not avail and "torch 2.13.0 is installed" in avail.reason
    monkeypatch.setattr(adapter_module, "installed_ipex_version", lambda: None)
    assert IpexAdapter.availability().reason == "intel-extension-for-pytorch is not installed"


def test_importing_the_vendor_module_with_a_mismatch_raises_the_clear_error() -> None:
    # IPEX's own check would crash in `os.exit`; the vendor module must stop before importing it.
    code = textwrap.dedent(
        """
        import importlib.metadata as md
        real = md.version
        md.version = lambda name: "2.13.0" if name == "torch" else real(name)
        try:
            import accel_ipex.ipex
        except ImportError as exc:
            print(type(exc).__name__, exc)
        import sys
        print("imported ipex:", "intel_extension_for_pytorch" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert "IpexVersionError intel-extension-for-pytorch 2.8.0 works only with torch 2.8.*" in out
    assert "imported ipex: False" in out


# ---- CPU capabilities ------------------------------------------------------------------------------
def test_cpuinfo_flags_are_read_from_the_first_processor(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512bw\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512bw"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2, False),
        (SKYLAKE_SP, True),
        (SIERRA_FOREST, True),
        (AVX2 | {"avx512bw", "avx512vl"}, False),  # avx512dq missing
        (frozenset(), False),
    ],
)
def test_bf16_prepack_rule(flags: frozenset[str], expected: bool) -> None:
    assert bf16_prepack_supported(flags) is expected


def test_weights_prepack_choice() -> None:
    assert choose_weights_prepack(low_precision=False, override=None, bf16_supported=False) is True
    assert choose_weights_prepack(low_precision=True, override=None, bf16_supported=False) is False
    assert choose_weights_prepack(low_precision=True, override=None, bf16_supported=True) is True
    assert choose_weights_prepack(low_precision=False, override=False, bf16_supported=True) is False
    assert choose_weights_prepack(low_precision=True, override=True, bf16_supported=False) is True


def test_flag_rule_agrees_with_ipex_on_this_cpu() -> None:
    """The documented flag rule and IPEX's own oneDNN check give the same answer here."""
    from accel_ipex import ipex

    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo on this platform")
    assert bf16_prepack_supported(flags) is ipex.bf16_prepack_supported()


def test_adapter_decides_prepack_per_precision_and_cpu() -> None:
    adapter = IpexAdapter()
    supported = adapter.bf16_prepack_supported()
    assert adapter.weights_prepack("no") is True
    assert adapter.weights_prepack("bf16") is supported
    assert IpexAdapter(options={"weights_prepack": False}).weights_prepack("no") is False
    assert IpexAdapter(options={"weights_prepack": True}).weights_prepack("bf16") is True


# ---- options ----------------------------------------------------------------------------------------
def test_options_from_environment_and_overrides() -> None:
    env = {"ACCEL_IPEX_WEIGHTS_PREPACK": "off", "ACCEL_IPEX_LEVEL": "o0", "ACCEL_IPEX_OPTIMIZE": "0"}
    assert IpexOptions.from_env(env) == IpexOptions(weights_prepack=False, level="O0", optimize=False)
    assert IpexOptions.from_env({"ACCEL_IPEX_WEIGHTS_PREPACK": "auto"}).weights_prepack is None
    assert IpexOptions.from_env(env, overrides={"level": "O1"}).level == "O1"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ACCEL_IPEX_WEIGHTS_PREPACK": "maybe"},
            "ACCEL_IPEX_WEIGHTS_PREPACK='maybe' is not a boolean; set it to auto, 1 or 0",
        ),
        ({"ACCEL_IPEX_OPTIMIZE": "2"}, "ACCEL_IPEX_OPTIMIZE='2' is not a boolean; set it to 1 or 0"),
        ({"ACCEL_IPEX_LEVEL": "O3"}, "level must be one of ('O0', 'O1'), got 'O3'"),
    ],
)
def test_bad_option_values_say_what_to_set(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        IpexOptions.from_env(env)
    assert message in str(info.value)


def test_unknown_override_is_refused() -> None:
    with pytest.raises(ValueError, match=r"Unknown IPEX adapter option\(s\) \['prepack'\]"):
        IpexAdapter(options={"prepack": True})


def test_launch_flags_become_worker_environment() -> None:
    parser = argparse.ArgumentParser()
    IpexAdapter.add_launch_arguments(parser.add_argument_group("ipex"))
    args = parser.parse_args(["--ipex-weights-prepack", "off", "--ipex-level", "O0", "--no-ipex-optimize"])
    env = IpexAdapter.launch_env(args)
    assert env == {"ACCEL_IPEX_WEIGHTS_PREPACK": "0", "ACCEL_IPEX_LEVEL": "O0", "ACCEL_IPEX_OPTIMIZE": "0"}
    assert IpexOptions.from_env(env) == IpexOptions(weights_prepack=False, level="O0", optimize=False)
    assert IpexAdapter.launch_env(parser.parse_args([])) == {}
