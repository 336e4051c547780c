"""Accelerate's IPEX switches as `accel launch` and the Accelerator take them with accel-ipex installed: the
`--ipex` launch flag, a config file's `ipex_config: {ipex: true|false}` (what `accelerate config` writes on a
CPU) and `ACCELERATE_USE_IPEX` (what `accelerate launch` exported from them; `false` opts out of
ipex.optimize). The core names no vendor: the adapter declares each of them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.cli import _launch_parser
from accel.commands import UsageError
from accel.commands.launch import worker_env
from accel.commands.launch_resolve import _selected_adapter, resolve
from accel.compat.env import apply_accelerate_env
from accel_ipex import IpexAdapter
from ipex_models import Net


def _resolve(tmp_path: Path, *flags: str, config: str | None = None):
    script = tmp_path / "train.py"
    script.write_text("")
    if config is not None:
        (tmp_path / "accelerate.yaml").write_text(config)
        flags = ("--config_file", str(tmp_path / "accelerate.yaml"), *flags)
    argv = [*flags, "--num-processes", "1", str(script)]
    parser = _launch_parser(argv)
    return resolve(parser.parse_args(argv), parser)


@pytest.fixture(autouse=True)
def no_launcher_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ACCEL_ADAPTER", "ACCELERATE_USE_IPEX", "ACCEL_IPEX_OPTIMIZE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("flags", [("--ipex",), ("--cpu", "--ipex"), ("--ipex", "--cpu")])
def test_ipex_flag_selects_the_adapter_with_optimize_on(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """`accelerate launch --ipex` (and `--cpu --ipex`, Accelerate's CPU run with IPEX), in either order."""
    args = _resolve(tmp_path, *flags)
    assert _selected_adapter(args) is IpexAdapter
    env = worker_env(args)
    assert env["ACCEL_ADAPTER"] == "ipex" and env["ACCEL_IPEX_OPTIMIZE"] == "1"


def test_cpu_alone_stays_plain_pytorch_and_ipex_with_another_adapter_is_refused(tmp_path: Path) -> None:
    assert _selected_adapter(_resolve(tmp_path, "--cpu")).name == "cpu"  # Accelerate without --ipex: no IPEX
    with pytest.raises(UsageError, match=r"^--ipex: a flag of the 'ipex' adapter, but 'cpu' is selected"):
        _resolve(tmp_path, "--adapter", "cpu", "--ipex")


CPU_CONFIG = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
ipex_config:
  ipex: {ipex}
"""


def test_config_file_ipex_true_runs_the_ipex_adapter(tmp_path: Path) -> None:
    """The file `accelerate config` writes for a CPU run with IPEX (use_cpu: true and ipex: true)."""
    args = _resolve(tmp_path, config=CPU_CONFIG.format(ipex="true"))
    assert _selected_adapter(args) is IpexAdapter
    assert worker_env(args)["ACCEL_IPEX_OPTIMIZE"] == "1"


def test_config_file_ipex_false_runs_without_ipex(tmp_path: Path) -> None:
    """`ipex: false` (Accelerate's CPU default): the cpu adapter, and no flag of the ipex adapter refused; in a
    file without use_cpu the ipex adapter runs (the best one here), with ipex.optimize off."""
    args = _resolve(tmp_path, config=CPU_CONFIG.format(ipex="false"))
    assert _selected_adapter(args).name == "cpu"
    one_process = CPU_CONFIG.format(ipex="false").replace("use_cpu: true\n", "").replace("MULTI_CPU", "'NO'")
    args = _resolve(tmp_path, config=one_process)
    assert _selected_adapter(args) is IpexAdapter
    assert worker_env(args)["ACCEL_IPEX_OPTIMIZE"] == "0"


def test_config_file_bad_ipex_config_names_the_key(tmp_path: Path) -> None:
    from accel.settings.config_file import ConfigError

    with pytest.raises(
        ConfigError, match=r"accelerate.yaml:7: ipex_config: ipex: expected true or false, got 'maybe'$"
    ):
        _resolve(tmp_path, config=CPU_CONFIG.format(ipex="maybe"))


def test_accelerate_use_ipex_false_opts_out_of_ipex_optimize(monkeypatch: pytest.MonkeyPatch) -> None:
    """What IPEX does to the model shows the switch: with ACCELERATE_USE_IPEX=false the conv stays torch's (IPEX
    swaps it for its prepacked `_IPEXConv2d` otherwise)."""
    env = {"ACCELERATE_USE_IPEX": "false"}
    assert apply_accelerate_env(env) == [] and env["ACCEL_IPEX_OPTIMIZE"] == "false"
    monkeypatch.setenv("ACCELERATE_USE_IPEX", "false")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot honour ACCELERATE_USE_IPEX" warning
        acc = Accelerator()
    model = Net()
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert acc.adapter.name == "ipex" and type(model.conv) is torch.nn.Conv2d


def test_accelerate_use_ipex_true_keeps_ipex_optimize(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_IPEX", "true")
    acc = Accelerator()
    model = Net()
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert type(model.conv) is not torch.nn.Conv2d  # IPEX's prepacked conv
