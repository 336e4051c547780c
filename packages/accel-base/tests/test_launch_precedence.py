"""Which value wins: an `Accelerator(...)` argument over the launcher's variable, which wins over the config file;
`accel launch` exports only what the user set; a command-line flag replaces the file's value (strategies included);
Accelerate's own default config file is used when accel has none (docs/launching.md, "Which value wins").
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from accel import Accelerator
from accel.cli import _launch_parser, worker_env
from accel.commands.launch_resolve import resolve
from accel.compat import env as accelerate_env
from accel.settings.config_file import AccelConfig, ConfigError, save_accel_config, write_basic_config
from accel.settings.kwargs import InitProcessGroupKwargs, TorchDynamoPlugin


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No launcher variable and no config file of the user's: each test sets its own."""
    monkeypatch.setattr(accelerate_env, "_warned", False)
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("ACCEL_", "ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")):
            del os.environ[name]
    os.environ["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # neither accel's nor Accelerate's default file
    os.environ["HF_HOME"] = str(tmp_path / "hf")
    yield
    os.environ.clear()
    os.environ.update(saved)


def _build(**kwargs: Any) -> tuple[Accelerator, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(**kwargs)
    return accelerator, [str(w.message) for w in caught if "Accelerator():" in str(w.message)]


# One case per setting the launcher exports that a script can also pass in code:
# (variable, launcher's value, the code's arguments, what the Accelerator ends up with, both values as named).
CODE_WINS = [
    pytest.param(
        "ACCEL_GRADIENT_ACCUMULATION_STEPS",
        "1",
        {"gradient_accumulation_steps": 2},
        lambda a: a.gradient_accumulation_steps == 2,
        ("gradient_accumulation_steps=2", "ACCEL_GRADIENT_ACCUMULATION_STEPS=1"),
        id="accumulation",
    ),
    pytest.param(
        "ACCEL_GRADIENT_ACCUMULATION_STEPS",
        "4",
        {"gradient_accumulation_steps": 1},  # passed in code, equal to the default: still the code's
        lambda a: a.gradient_accumulation_steps == 1,
        ("gradient_accumulation_steps=1", "ACCEL_GRADIENT_ACCUMULATION_STEPS=4"),
        id="accumulation-explicit-1",
    ),
    pytest.param(
        "ACCEL_MIXED_PRECISION",
        "bf16",
        {"mixed_precision": "no"},
        lambda a: a.mixed_precision == "no",
        ("mixed_precision='no'", "ACCEL_MIXED_PRECISION=bf16"),
        id="precision",
    ),
    pytest.param(
        "ACCEL_STRATEGY",
        "fsdp2",
        {"strategy": "ddp"},
        lambda a: a.strategy.name == "ddp",
        ("strategy='ddp'", "ACCEL_STRATEGY=fsdp2"),
        id="strategy",
    ),
    pytest.param(
        "ACCEL_DYNAMO_BACKEND",
        "eager",
        {"dynamo_backend": "no"},
        lambda a: str(a.state.dynamo_plugin.backend).lower().endswith("no"),
        ("dynamo_backend='no'", "ACCEL_DYNAMO_BACKEND=eager"),
        id="dynamo",
    ),
    pytest.param(
        "ACCEL_ADAPTER",
        "fakedev",
        {"cpu": True},
        lambda a: a.state.adapter.name == "cpu",
        ("cpu=True", "ACCEL_ADAPTER=fakedev"),
        id="adapter",
    ),
    pytest.param(
        "ACCEL_USE_CPU",
        "1",
        {"adapter": "fakedev", "emulate": True},
        lambda a: a.state.adapter.name == "fakedev",
        ("adapter='fakedev'", "ACCEL_USE_CPU=1"),
        id="use-cpu",
    ),
    pytest.param(
        "ACCEL_EMULATE",
        "1",
        {"emulate": False},
        lambda a: a.state.emulate is False,
        ("emulate=False", "ACCEL_EMULATE=1"),
        id="emulate",
    ),
    pytest.param(
        "ACCEL_TIMEOUT",
        "5",
        {"kwargs_handlers": [InitProcessGroupKwargs(timeout=timedelta(seconds=60))]},
        lambda a: a.state.timeout == timedelta(seconds=60),
        ("InitProcessGroupKwargs(timeout=60s)", "ACCEL_TIMEOUT=5"),
        id="timeout",
    ),
]


@pytest.mark.parametrize(("variable", "value", "code", "check", "named"), CODE_WINS)
def test_an_argument_in_code_wins_over_the_launcher_with_one_warning(
    variable: str, value: str, code: dict[str, Any], check: Any, named: tuple[str, str]
) -> None:
    os.environ[variable] = value
    accelerator, warned = _build(**code)
    assert check(accelerator)
    assert len(warned) == 1, warned
    assert all(part in warned[0] for part in named), warned[0]
    assert "in the code wins over" in warned[0]


@pytest.mark.parametrize(
    ("variable", "value", "check"),
    [
        ("ACCEL_GRADIENT_ACCUMULATION_STEPS", "3", lambda a: a.gradient_accumulation_steps == 3),
        ("ACCEL_MIXED_PRECISION", "bf16", lambda a: a.mixed_precision == "bf16"),
        ("ACCEL_TIMEOUT", "5", lambda a: a.state.timeout == timedelta(seconds=5)),
        ("ACCEL_DEBUG_MODE", "1", lambda a: a.state.debug is True),
    ],
)
def test_the_launcher_fills_what_the_code_leaves_out_silently(variable: str, value: str, check: Any) -> None:
    os.environ[variable] = value
    accelerator, warned = _build(cpu=True)
    assert check(accelerator)
    assert warned == []


def test_the_same_value_in_code_and_launcher_is_not_warned_about() -> None:
    os.environ.update(ACCEL_GRADIENT_ACCUMULATION_STEPS="2", ACCEL_MIXED_PRECISION="BF16")
    os.environ["ACCEL_DYNAMO_BACKEND"] = "eager"
    plugin = TorchDynamoPlugin(backend="EAGER")
    accelerator, warned = _build(gradient_accumulation_steps=2, mixed_precision="bf16", dynamo_plugin=plugin)
    assert (accelerator.gradient_accumulation_steps, accelerator.mixed_precision, warned) == (2, "bf16", [])


def test_accelerates_variable_is_named_when_accelerate_launch_set_it() -> None:
    os.environ["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = "4"
    accelerator, warned = _build(gradient_accumulation_steps=2)
    assert accelerator.gradient_accumulation_steps == 2
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4" in warned[0]


# --- the launcher: what it exports ---------------------------------------------------------------------------


def _exported(tmp_path: Path, *argv: str) -> dict[str, str]:
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    parser = _launch_parser(argv)
    return worker_env(resolve(parser.parse_args([*argv, str(script)]), parser))


SETTINGS_VARIABLES = ("ACCEL_GRADIENT_ACCUMULATION_STEPS", "ACCEL_MIXED_PRECISION", "ACCEL_DYNAMO_BACKEND")


def test_a_config_file_of_defaults_exports_nothing(tmp_path: Path) -> None:
    # What `accel config default` (and pressing Enter at every question) writes.
    path = write_basic_config(save_location=tmp_path / "defaults.yaml")
    assert "gradient_accumulation_steps: 1" in Path(path).read_text()
    env = _exported(tmp_path, "--cpu", "--config_file", str(path))
    assert not {*SETTINGS_VARIABLES, "ACCEL_STRATEGY", "ACCEL_TIMEOUT", "ACCEL_DEBUG_MODE", "ACCEL_EMULATE"} & set(
        env
    ), env


def test_values_the_user_set_are_exported_from_the_file_and_the_flags(tmp_path: Path) -> None:
    path = tmp_path / "set.yaml"
    save_accel_config(
        AccelConfig(
            mixed_precision="bf16", gradient_accumulation_steps=4, dynamo_backend="eager", timeout=30.0, debug=True
        ),
        path,
    )
    env = _exported(tmp_path, "--cpu", "--config_file", str(path))
    assert [env.get(v) for v in SETTINGS_VARIABLES] == ["4", "bf16", "eager"]
    assert (env["ACCEL_TIMEOUT"], env["ACCEL_DEBUG_MODE"]) == ("30.0", "1")
    # A flag is always set, the default's value included; it replaces the file's.
    flags = ("--gradient_accumulation_steps", "1", "--mixed_precision", "no", "--dynamo_backend", "no")
    env = _exported(tmp_path, "--cpu", "--config_file", str(path), *flags)
    assert [env.get(v) for v in SETTINGS_VARIABLES] == ["1", "no", "no"]


def test_the_environment_beats_the_file_and_a_flag_beats_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "set.yaml"
    save_accel_config(AccelConfig(mixed_precision="fp16", gradient_accumulation_steps=4), path)
    os.environ.update(ACCEL_MIXED_PRECISION="bf16", ACCEL_GRADIENT_ACCUMULATION_STEPS="8")
    env = _exported(tmp_path, "--cpu", "--config_file", str(path))
    assert "ACCEL_MIXED_PRECISION" not in env and "ACCEL_GRADIENT_ACCUMULATION_STEPS" not in env  # the user's stay
    env = _exported(tmp_path, "--cpu", "--config_file", str(path), "--mixed_precision", "no")
    assert env["ACCEL_MIXED_PRECISION"] == "no"


@pytest.mark.parametrize(
    ("file_strategy", "flags", "expected"),
    [
        ("ddp", ("--use_fsdp",), "fsdp2"),
        ("fsdp2", ("--strategy", "ddp"), "ddp"),
        ("fsdp2", ("--use_fsdp",), "fsdp2"),
    ],
)
def test_a_strategy_flag_replaces_the_files_strategy(
    tmp_path: Path, file_strategy: str, flags: tuple[str, ...], expected: str
) -> None:
    path = tmp_path / "strategy.yaml"
    config = {"cpu_offload": True} if file_strategy == "fsdp2" else {}
    save_accel_config(AccelConfig(strategy=file_strategy, strategy_config=config), path)
    env = _exported(tmp_path, "--cpu", "--config_file", str(path), *flags)
    assert env["ACCEL_STRATEGY"] == expected
    # The file's settings go with its strategy: kept for the same one, dropped for another.
    assert ("cpu_offload" in env.get("ACCEL_STRATEGY_CONFIG", "")) == (file_strategy == expected == "fsdp2")


def test_two_strategies_on_the_command_line_are_still_refused(tmp_path: Path) -> None:
    from accel.commands import UsageError

    with pytest.raises(UsageError, match="choose one strategy; the command line asks for ddp and fsdp2"):
        _exported(tmp_path, "--cpu", "--strategy", "ddp", "--use_fsdp")


# --- Accelerate's default config file --------------------------------------------------------------------------

ACCELERATE_MULTI_CPU = """compute_environment: LOCAL_MACHINE
distributed_type: MULTI_CPU
mixed_precision: 'no'
num_machines: 1
num_processes: 2
use_cpu: true
"""


def test_accelerates_default_config_is_used_when_accel_has_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    theirs.parent.mkdir(parents=True)
    theirs.write_text(ACCELERATE_MULTI_CPU)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    parser = _launch_parser([])
    args = resolve(parser.parse_args([str(script)]), parser)
    assert (args.num_processes, args.cpu) == (2, True)
    said = capsys.readouterr().err
    assert said.count(f"using Accelerate's config {theirs}") == 1, said
    assert args.start_line.endswith(f"Accelerate's config {theirs}")
    # ACCELERATE_CONFIG_FILE names another file; accel's own default file wins over both.
    other = tmp_path / "other.yaml"
    other.write_text(ACCELERATE_MULTI_CPU.replace("num_processes: 2", "num_processes: 3"))
    os.environ["ACCELERATE_CONFIG_FILE"] = str(other)
    assert resolve(parser.parse_args([str(script)]), parser).num_processes == 3
    save_accel_config(AccelConfig(num_processes=1), tmp_path / "cache" / "accel" / "default_config.yaml")
    args = resolve(parser.parse_args([str(script)]), parser)
    assert args.num_processes == 1 and "Accelerate" not in args.start_line
    os.environ["ACCELERATE_CONFIG_FILE"] = str(tmp_path / "missing.yaml")
    (tmp_path / "cache" / "accel" / "default_config.yaml").unlink()
    with pytest.raises(ConfigError, match=r"ACCELERATE_CONFIG_FILE=.*missing.yaml does not exist"):
        resolve(parser.parse_args([str(script)]), parser)


# --- start-up line and typos -----------------------------------------------------------------------------------


def test_a_flag_typo_gets_a_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _launch_parser([])
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--num_processs", "2", str(tmp_path / "train.py")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "did you mean --num_processes?" in err
    assert "vendor" not in err


def _accel(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_ADAPTER"}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "accel.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


PROBE = """import warnings
warnings.simplefilter("always")
from accel import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=2)
print(f"rank {accelerator.process_index} steps {accelerator.gradient_accumulation_steps}")
"""


def test_accel_launch_never_overrides_the_scripts_accumulation(tmp_path: Path) -> None:
    """The reported bug: a config file of defaults made every rank accumulate over 1 step, silently."""
    (tmp_path / "probe.py").write_text(PROBE)
    config = write_basic_config(save_location=tmp_path / "defaults.yaml")
    proc = _accel("launch", "--cpu", "--num_processes", "2", "--config_file", str(config), "probe.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Both ranks print one line each (they may interleave); nothing of the launcher's on stdout.
    assert sorted(re.findall(r"rank \d steps \d", proc.stdout)) == ["rank 0 steps 2", "rank 1 steps 2"], proc.stdout
    assert "accel launch" not in proc.stdout
    assert "wins over" not in proc.stderr
    start = f"accel launch: starting 2 processes: adapter cpu, strategy ddp, config {config}"
    assert proc.stderr.count(start) == 1, proc.stderr[-3000:]
    # A flag the user gave disagrees with the code: the code wins, one warning (rank 0 of the node) names both.
    proc = _accel(
        "launch", "--cpu", "--num_processes", "2", "--gradient_accumulation_steps", "3", "probe.py", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(re.findall(r"rank \d steps \d", proc.stdout)) == ["rank 0 steps 2", "rank 1 steps 2"]
    assert (
        proc.stderr.count("gradient_accumulation_steps=2 in the code wins over ACCEL_GRADIENT_ACCUMULATION_STEPS=3")
        == 1
    )


def test_the_accumulation_default_reads_as_1_and_is_told_apart_from_a_1_in_code() -> None:
    """The API reference and `help(Accelerator)` show `= 1`; leaving it out still gives the marker."""
    import inspect

    from accel.settings.accelerator import DEFAULT_GRADIENT_ACCUMULATION_STEPS

    parameter = inspect.signature(Accelerator).parameters["gradient_accumulation_steps"]
    assert str(parameter) == "gradient_accumulation_steps: 'int' = 1"
    assert parameter.default is DEFAULT_GRADIENT_ACCUMULATION_STEPS
    source = inspect.getsource(Accelerator.__init__)
    assert "gradient_accumulation_steps: int = 1," in source
