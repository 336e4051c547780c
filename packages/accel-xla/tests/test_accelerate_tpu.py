"""`accelerate launch --tpu` command lines and TPU config files written by `accelerate config` (1.15), as
`accel launch` takes them with accel-xla installed: `--tpu` selects the xla adapter, the pod launcher's
flags and keys are refused with what to do or accepted as no-ops, saying so once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from accel.cli import _launch_parser
from accel.commands import UsageError
from accel.commands.launch_resolve import _selected_adapter, resolve
from accel.compat.config_file import accelerate_launch_defaults
from accel.settings.config_file import ConfigError, read_yaml
from accel.testing.launching import run_launch
from accel_xla import XLAAdapter

FIXTURE = Path(__file__).parent / "fixtures" / "accelerate_tpu_pod.yaml"
WORKER = Path(__file__).parent / "workers" / "tpu_host.py"
# Every key accelerate 1.15's ClusterConfig has for TPU pods ("# args for TPU pods"), besides the ones the
# core maps itself (main_training_function; `downcast_bf16` is this adapter's, test_downcast_bf16.py).
ACCELERATE_TPU_POD_KEYS = {
    "tpu_name", "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
}  # fmt: skip
HARMLESS = ["command_file", "commands", "tpu_env", "tpu_name", "tpu_use_sudo", "tpu_vm", "tpu_zone"]


def _parse(tmp_path: Path, *flags: str):
    script = tmp_path / "train.py"
    script.write_text("")
    argv = [*flags, str(script)]
    parser = _launch_parser(argv)
    return parser.parse_args(argv), parser


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    with pytest.raises(SystemExit) as exc:
        _parse(tmp_path, *flags)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[0]


def test_tpu_selects_the_xla_adapter_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_ADAPTER", "cpu")
    base = ("--emulate", "--num-processes", "1")
    args, parser = _parse(tmp_path, *base)
    assert _selected_adapter(resolve(args, parser)).name == "cpu"  # ACCEL_ADAPTER=cpu decides
    for flags in (("--tpu",), ("--adapter", "xla", "--tpu"), ("--tpu", "--adapter", "xla")):
        args, parser = _parse(tmp_path, *base, *flags)
        assert (args.adapter, args.tpu) == ("xla", True), flags
        resolved = resolve(args, parser)
        assert resolved.adapter == "xla" and _selected_adapter(resolved) is XLAAdapter, flags
        assert XLAAdapter.launch_env(resolved) == {}, "--tpu sets no variable (torch_xla finds the TPU itself)"


def test_tpu_with_other_hardware_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ACCEL_ADAPTER", raising=False)
    # Accelerate also refuses --cpu with --tpu ("You can only use one of `--cpu`, ..., `--tpu`").
    assert _refused(tmp_path, capsys, "--cpu", "--tpu") == (
        "accel launch: error: --tpu and --cpu ask for different hardware; give one of them"
    )
    args, parser = _parse(tmp_path, "--tpu", "--cpu")
    with pytest.raises(UsageError, match=r"^--cpu and --adapter xla ask for different hardware; give one of them$"):
        resolve(args, parser)
    for flags in (("--adapter", "cpu", "--tpu"), ("--tpu", "--adapter", "cpu")):
        args, parser = _parse(tmp_path, *flags)
        with pytest.raises(
            UsageError, match=r"^--tpu: a flag of the 'xla' adapter, but 'cpu' is selected: add --adapter"
        ):
            resolve(args, parser)


@pytest.mark.parametrize("flag", ["--tpu_cluster", "--tpu-cluster"])
def test_the_pod_launcher_is_refused_saying_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    line = _refused(tmp_path, capsys, "--tpu", flag)
    assert line.startswith(
        f"accel launch: error: {flag} (an `accelerate launch` flag) is not supported by accel launch: "
    )
    assert "on each host of the pod" in line and "--nnodes N --node-rank R" in line


@pytest.mark.parametrize("flag", ["--vm", "--env"])
def test_accelerates_pod_value_flags_stay_refused_by_the_core(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """accel itself refuses --vm/--env; the adapter does not declare them (a clash would drop its whole group)."""
    line = _refused(tmp_path, capsys, "--tpu", flag, "x=1")
    assert line.startswith(
        f"accel launch: error: {flag} (an `accelerate launch` flag) is not supported by accel launch"
    )
    args, _ = _parse(tmp_path, "--tpu")
    assert set(args._adapter_dests["xla"]) == {
        "pjrt_device",
        "xla_cpu_devices",
        "downcast_bf16",
        "tpu",
        "tpu_use_cluster",
        "tpu_use_sudo",
    }


def test_single_host_pod_flags_are_accepted_as_no_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ACCEL_ADAPTER", raising=False)
    args, parser = _parse(
        tmp_path, "--tpu", "--no_tpu_cluster", "--no-tpu-cluster", "--emulate", "--num-processes", "1"
    )
    assert args.tpu_use_cluster is False
    assert "--no" not in capsys.readouterr().err, "Accelerate's default asks for nothing: no note"
    args, parser = _parse(tmp_path, "--tpu", "--tpu_use_sudo", "--tpu-use-sudo", "--emulate", "--num-processes", "1")
    notes = [line for line in capsys.readouterr().err.splitlines() if "is ignored" in line]
    assert notes == [
        "accel launch: --tpu_use_sudo is ignored: it only tells Accelerate's pod launcher to run the script with sudo "
        "on each host; `accel launch` runs the script on this host, as you started it"
    ]
    assert args.tpu_use_sudo is True and resolve(args, parser).adapter == "xla"
    # Another adapter selected: the flag is the xla adapter's, refused as any adapter's flag is.
    args, parser = _parse(tmp_path, "--cpu", "--tpu-use-sudo")
    with pytest.raises(UsageError, match=r"^--tpu-use-sudo: a flag of the 'xla' adapter, but 'cpu' is selected"):
        resolve(args, parser)


def test_the_adapter_declares_every_tpu_pod_key_accelerate_writes() -> None:
    data, _ = read_yaml(FIXTURE)
    assert set(XLAAdapter.accelerate_config_keys) == ACCELERATE_TPU_POD_KEYS
    assert set(data) >= ACCELERATE_TPU_POD_KEYS, "the fixture carries every pod key"
    assert [k for k, why in XLAAdapter.accelerate_config_keys.items() if why] == ["tpu_use_cluster"]


def test_a_tpu_pod_config_file_loads_with_one_note_naming_its_pod_keys() -> None:
    data, lines = read_yaml(FIXTURE)
    values, notes = accelerate_launch_defaults(data, lines)
    assert values["required_hardware"] == "XLA" and values["num_processes"] == 8
    assert values["mixed_precision"] == "bf16"
    ignored = [n for n in notes if "ignored" in n]
    assert len(ignored) == 1, notes
    named, rest = ignored[0].split(": ignored ", 1)
    assert sorted(named.split(", ")) == HARMLESS
    assert rest.startswith("(the xla adapter calls them harmless)")
    with pytest.raises(ConfigError, match=r"accelerate_tpu_pod\.yaml:\d+: tpu_use_cluster: Accelerate's TPU pod "
                       r"launcher \(it ssh'es into every host\) has no counterpart: run `accel launch"):  # fmt: skip
        accelerate_launch_defaults({**data, "tpu_use_cluster": True}, lines)


def _workers(stdout: str) -> list[dict]:
    return [json.loads(line.removeprefix("WORKER ")) for line in stdout.splitlines() if line.startswith("WORKER ")]


def test_accelerate_tpu_command_line_runs_on_the_xla_device() -> None:
    """`accel launch --tpu` (no --adapter) on torch_xla's CPU device: the worker trains on xla:0."""
    pytest.importorskip("torch_xla")
    flags = ("--tpu", "--no_tpu_cluster", "--pjrt-device", "CPU", "--xla-cpu-devices", "1")
    proc = run_launch(WORKER, nproc=1, launch_args=flags, env={"PJRT_DEVICE": "CPU"})
    (worker,) = _workers(proc.stdout)
    assert worker["adapter"] == "xla" and worker["device"] == "xla:0" and worker["index"] == 0
    assert worker["env"]["CPU_NUM_DEVICES"] == "1" and worker["loss"] > 0


def test_accelerate_tpu_config_file_runs_with_one_note() -> None:
    """`accel launch --config_file` with the file `accelerate config` wrote: the xla adapter (the one installed
    for distributed_type XLA), bf16 from the file, the pod keys named once."""
    pytest.importorskip("torch_xla")
    flags = ("--config_file", str(FIXTURE), "--pjrt-device", "CPU", "--xla-cpu-devices", "1")
    proc = run_launch(WORKER, nproc=1, launch_args=flags, env={"PJRT_DEVICE": "CPU"})
    (worker,) = _workers(proc.stdout)
    assert worker["adapter"] == "xla" and worker["device"] == "xla:0"
    assert worker["mixed_precision"] == "bf16" and worker["num_processes"] == 1
    notes = [line for line in proc.stderr.splitlines() if "ignored (the xla adapter calls them harmless)" in line]
    assert len(notes) == 1 and all(key in notes[0] for key in HARMLESS), proc.stderr
