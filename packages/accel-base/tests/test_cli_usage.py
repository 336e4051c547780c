"""The `accel` command answers like a tool: one or two lines and exit 2 for a user's mistake, never a
traceback; a failing worker's traceback shown once with its rank; `accel env` tells the truth."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from accel.cli import _launch_parser, worker_env
from accel.commands import UsageError
from accel.commands.env import installed
from accel.commands.launch_resolve import _device_count, resolve
from accel.errors import StrategyNotFoundError


def accel(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 300):
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("ACCEL_ADAPTER", None)
    return subprocess.run(
        [sys.executable, "-m", "accel.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=timeout,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('trained')\n")
    return path


def _busy_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("", 0))
    s.listen()
    return s, s.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--num-processes", "0"), "--num-processes must be at least 1, got 0"),
        (("--adapter", "foo"), "--cpu and --adapter foo ask for different hardware"),
        (("--strategy", "nope"), "No accel strategy named 'nope'. Installed strategies: ddp"),
        (("--nnodes", "3:2"), "--nnodes must be N or MIN:MAX"),
        (("--max-restarts", "-1"), "--max-restarts must be >= 0"),
        (("--module", "--no-python"), "--module and --no-python cannot be combined"),
        (("--use_deepspeed", "--use_fsdp"), "choose one strategy"),
        (("--zero_stage", "2"), "need --use_deepspeed"),
        (("--num_processes", "3", "--num_machines", "2"), "does not split evenly over 2 machines"),
        (("--mixed-precision", "fp64"), "invalid choice: 'fp64'"),
        (("--frobnicate",), "unrecognized arguments: --frobnicate"),
        # Caught by the launcher, not by every worker: what the cpu adapter and torch can never run.
        (("--mixed_precision", "fp8"), "--mixed-precision fp8: the 'cpu' adapter does not support it"),
        (("--dynamo_backend", "bogus"), "--dynamo-backend bogus: torch.compile has no backend of that name"),
        # One adapter's flag without it: unknown, not an ambiguous prefix of the --fp8_* flags.
        (("--fp8",), "unrecognized arguments: --fp8. Flags for one vendor's hardware come with its accel adapter"),
        (("--use_deep",), "unrecognized arguments: --use_deep"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(script: Path, args: tuple[str, ...], message: str) -> None:
    proc = accel("launch", "--cpu", *args, str(script))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert "trained" not in proc.stdout


def test_unknown_adapter_lists_the_installed_ones(script: Path) -> None:
    proc = accel("launch", "--adapter", "foo", str(script))
    assert proc.returncode == 2 and "No accel adapter named 'foo'" in proc.stderr and "cpu" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_script_and_module_are_named(tmp_path: Path) -> None:
    proc = accel("launch", "--cpu", "nothere.py", cwd=tmp_path)
    assert proc.returncode == 2 and "the training script 'nothere.py' does not exist" in proc.stderr
    proc = accel("launch", "--cpu", "-m", "no_such_module_xyz", cwd=tmp_path)
    assert proc.returncode == 2 and "no module named 'no_such_module_xyz'" in proc.stderr


def test_port_in_use_is_detected_before_starting(script: Path) -> None:
    holder, port = _busy_port()
    with holder:
        proc = accel("launch", "--cpu", "--num-processes", "2", "--main-process-port", str(port), str(script))
    assert proc.returncode == 2
    assert f"port {port} on this machine is in use" in proc.stderr and "Traceback" not in proc.stderr


def test_worker_failure_shows_its_traceback_once_with_the_rank(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('boom on one')\n")
    proc = accel("launch", "--cpu", "--num-processes", "2", str(bad))
    assert proc.returncode == 1
    assert proc.stderr.count("RuntimeError: boom on one") == 1, proc.stderr[-3000:]
    # The summary names the user's script (not accel's worker bootstrap) and points at the traceback.
    summary = proc.stderr[proc.stderr.index(f"accel launch: {bad}") :]
    assert summary.startswith(f"accel launch: {bad} failed:"), summary
    assert "rank 1: exit code 1 (its traceback is above)" in summary
    assert "worker_bootstrap" not in summary and "pytorch.org" not in summary


def test_cpu_default_is_one_process_and_says_so(script: Path) -> None:
    proc = accel("launch", "--cpu", str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("trained") == 1
    assert "accel launch: starting 1 process (no devices counted; --num-processes N sets the number)" in proc.stderr


def test_default_process_count_is_the_vendor_modules_device_count(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "fake_vendor_mod.py").write_text("def device_count():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Counted:
        vendor_module = "fake_vendor_mod"

    class NoVendor:
        vendor_module = None

    assert _device_count(Counted, emulate=False) == 3
    assert _device_count(Counted, emulate=True) == 1  # emulation runs on the CPU
    assert _device_count(NoVendor, emulate=False) == 1


def test_threads_per_process(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("ACCEL_ADAPTER", raising=False)

    def env(*args: str) -> dict[str, str]:
        parser = _launch_parser(args)
        return worker_env(resolve(parser.parse_args([*args, str(script)]), parser))

    assert env("--cpu", "--num-processes", "2", "--num_cpu_threads_per_process", "3")["OMP_NUM_THREADS"] == "3"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert env("--cpu", "--num-processes", "2")["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert "OMP_NUM_THREADS" not in env("--cpu", "--num-processes", "1")  # one process keeps every core
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert "OMP_NUM_THREADS" not in env("--cpu", "--num-processes", "2")  # the user's setting stays


def test_workers_get_the_thread_count(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os, torch\nprint('threads', os.environ['OMP_NUM_THREADS'], torch.get_num_threads())\n")
    proc = accel("launch", "--cpu", "--num-processes", "1", "--num-cpu-threads-per-process", "2", str(probe))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "threads 2 2" in proc.stdout


def test_strategy_names_have_their_own_error(script: Path) -> None:
    parser = _launch_parser([])
    with pytest.raises(StrategyNotFoundError, match="No accel strategy named 'nope'"):
        resolve(parser.parse_args(["--cpu", "--strategy", "nope", str(script)]), parser)


def test_missing_deepspeed_names_the_pip_extra(script: Path) -> None:
    if installed("deepspeed"):
        pytest.skip("deepspeed is installed here")
    parser = _launch_parser([])
    with pytest.raises(UsageError, match=r"pip install 'accel-base\[deepspeed\]'"):
        resolve(parser.parse_args(["--cpu", "--use_deepspeed", str(script)]), parser)


def test_env_tells_the_truth_about_optional_packages(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("mixed_precision: bf16\n")
    out = accel("env", env={"ACCEL_CONFIG_FILE": str(config)}).stdout
    has_deepspeed = installed("deepspeed")
    line = next(line for line in out.splitlines() if line.strip().startswith("deepspeed ") and "for the" in line)
    assert ("not installed (pip install 'accel-base[deepspeed]')" in line) is not has_deepspeed
    if not has_deepspeed:
        assert "needs deepspeed, not installed" in out  # the strategy line, no longer "ok"
    assert f"config file: accel config file: {config}" in out
    assert 'mixed_precision: "bf16"' in out


def test_megatron_hints_name_the_extra_that_brings_megatron_core(script: Path, monkeypatch) -> None:
    """accel-megatron installed without megatron-core: the hint is its `megatron` extra, not the bare package."""
    from accel.commands import env as env_command

    real = env_command.installed
    monkeypatch.setattr(env_command, "installed", lambda module: module == "accel_megatron" or (
        real(module) and not module.startswith("megatron")))  # fmt: skip
    report = env_command.env_report()
    line = next(line for line in report.splitlines() if line.strip().startswith("megatron-core "))
    assert "not installed (pip install 'accel-megatron[megatron]')" in line
    assert "accel-megatron  installed" in report
    if installed("accel_megatron"):
        return
    parser = _launch_parser([])
    with pytest.raises(
        UsageError, match=r"the megatron strategy is not installed: pip install 'accel-megatron\[megatron\]'"
    ):
        resolve(parser.parse_args(["--cpu", "--use_megatron_lm", str(script)]), parser)


def test_accel_test_takes_the_rendezvous_flags() -> None:
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    proc = accel("test", "--cpu", "--main-process-port", str(port), timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "accel self-check passed on 2 process(es)" in proc.stdout
    assert accel("test", "train.py").returncode == 2


def test_unknown_command_and_help() -> None:
    proc = accel("frobnicate")
    assert proc.returncode == 2 and "unknown command 'frobnicate'" in proc.stderr
    assert accel("--help").returncode == 0
    assert "Traceback" not in accel("config", "show", "--config-file", "/nonexistent/x.yaml").stderr


def test_config_errors_exit_2_with_file_and_line(tmp_path: Path, script: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("mixed_precision: bf16\nnum_processes: two\n")
    proc = accel("launch", "--config-file", str(config), str(script))
    assert proc.returncode == 2
    assert f"{config}:2: num_processes: expected an integer, got 'two'" in proc.stderr


@pytest.mark.parametrize("command", ["launch", "config", "env", "test", "merge-weights", "estimate-memory"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from accel.cli import main

    try:
        code = main([command, "--help"])
    except SystemExit as exc:
        code = exc.code
    assert code == 0
    assert f"accel {command}" in capsys.readouterr().out


def test_a_slow_start_says_how_far_the_workers_got(tmp_path: Path) -> None:
    """Start-up that passes 5 s gets a progress line (how many processes run the script, how many joined the
    process group), then one when all are up; the folder the workers report through is removed."""
    slow = tmp_path / "slow.py"
    slow.write_text("import time\ntime.sleep(6.5)\nfrom accel import Accelerator\nAccelerator()\nprint('up')\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = accel("launch", "--cpu", "--num-processes", "2", str(slow), env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("accel launch: starting 2 processes"))
    progress = next(i for i, line in enumerate(lines) if line.startswith("accel launch: still starting after"))
    assert start < progress
    assert re.fullmatch(
        r"accel launch: still starting after 5 s: [0-2] of 2 processes running slow\.py, 0 joined the process group",
        lines[progress],
    )
    assert re.search(r"^accel launch: all 2 processes are up after \d+ s$", proc.stderr, re.M)
    assert proc.stdout.count("up") == 2
    assert list(scratch.glob("accel-launch-*")) == []
