"""Every `accelerate launch` flag (Accelerate 1.15.0's parser, fixtures/accelerate/launch_flags.json) is
accepted by `accel launch` with the same meaning under both spellings, or refused saying what to use."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from accel.cli import _launch_parser, build_torchrun_argv, worker_env
from accel.commands import UsageError
from accel.commands.launch_resolve import resolve

FLAGS = json.loads((Path(__file__).parent / "fixtures" / "accelerate" / "launch_flags.json").read_text())
# Named after one vendor's hardware: the core declares none of them (the adapter for that hardware does).
VENDOR_FLAGS = {"tpu", "tpu_cluster", "no_tpu_cluster", "tpu_use_sudo", "downcast_bf16"}
SAMPLES = {
    "config_file": "c.yaml",
    "tee": "3",
    "rdzv_conf": "timeout=5",
    "gpu_ids": "0,1",
    "role": "trainer",
    "fp8_override_linear_precision": "false,false,true",
}


def outcome(option: str, spec: dict[str, object], capsys: pytest.CaptureFixture[str]) -> str:
    argv = [option]
    if spec["takes_value"]:
        choices = spec["choices"]
        argv.append(str(choices[0]) if choices else SAMPLES.get(option.lstrip("-").replace("-", "_"), "1"))  # type: ignore[index]
    argv.append("train.py")
    try:
        _launch_parser(argv).parse_args(argv)
    except SystemExit as exc:
        err = capsys.readouterr().err
        assert exc.code == 2
        if "is not supported by accel launch: " in err:
            return "refused"
        if "come with its accel adapter package" in err:
            return "vendor"
        return f"error: {err}"
    return "accepted"


def test_every_accelerate_flag_is_accepted_or_refused_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, set[str]] = {}
    for name, spec in FLAGS.items():
        results = {outcome(option, spec, capsys) for option in spec["options"]}
        assert len(results) == 1, f"{name}: its spellings behave differently: {results}"
        seen.setdefault(results.pop(), set()).add(name)
    assert set(seen) <= {"accepted", "refused", "vendor"}, seen
    assert seen["vendor"] == VENDOR_FLAGS
    assert len(seen["accepted"]) >= 80  # processes, rendezvous, DeepSpeed, FSDP, Megatron, dynamo, ...
    for must in ("multi_gpu", "config_file", "num_machines", "machine_rank", "gradient_accumulation_steps",
                 "dynamo_backend", "use_deepspeed", "num_cpu_threads_per_process", "same_network"):  # fmt: skip
        assert must in seen["accepted"], must
    assert "gpu_ids" in seen["accepted"]  # the selected adapter's visible-devices variable


@pytest.mark.parametrize("spelling", ["snake", "kebab"])
def test_both_spellings_mean_the_same(tmp_path: Path, spelling: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("")

    def flag(name: str) -> str:
        return "--" + (name if spelling == "snake" else name.replace("_", "-"))

    argv = [flag("num_processes"), "4", flag("num_machines"), "2", flag("machine_rank"), "1"]
    argv += [flag("main_process_ip"), "10.0.0.1", flag("main_process_port"), "29555", flag("rdzv_backend"), "static"]
    argv += [flag("mixed_precision"), "bf16", flag("gradient_accumulation_steps"), "2", "--cpu", str(script)]
    parser = _launch_parser(argv)
    args = resolve(parser.parse_args(argv), parser)
    torchrun = build_torchrun_argv(args)
    # Accelerate's --num_processes counts every machine's processes; torchrun's counts per node.
    assert torchrun[:6] == ["--nproc-per-node", "2", "--nnodes", "2", "--max-restarts", "0"]
    assert torchrun[torchrun.index("--node-rank") + 1] == "1"
    assert torchrun[torchrun.index("--master-addr") + 1] == "10.0.0.1"
    assert torchrun[torchrun.index("--master-port") + 1] == "29555"
    env = worker_env(args)
    assert (env["ACCEL_MIXED_PRECISION"], env["ACCEL_GRADIENT_ACCUMULATION_STEPS"]) == ("bf16", "2")


def _env_for(tmp_path: Path, *flags: str) -> dict[str, str]:
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--cpu", *flags, str(script)]
    parser = _launch_parser(argv)
    return worker_env(resolve(parser.parse_args(argv), parser))


def test_gpu_ids_need_an_adapter_with_a_visible_devices_variable(tmp_path: Path) -> None:
    """`--gpu_ids all` asks for nothing (Accelerate's default); ids on an adapter without such a variable
    (the built-in cpu one) are refused naming it, not dropped."""
    assert not any(k.endswith("VISIBLE_DEVICES") for k in _env_for(tmp_path, "--gpu_ids", "all"))
    with pytest.raises(UsageError, match=r"--gpu_ids 0,2: the 'cpu' adapter has no visible-devices variable"):
        _env_for(tmp_path, "--gpu_ids", "0, 2")
    with pytest.raises(UsageError, match=r"--gpu_ids takes comma-separated device ids \(or all\), got '0,,1'"):
        _env_for(tmp_path, "--gpu_ids", "0,,1")


def test_fsdp_flags_become_the_fsdp2_config(tmp_path: Path) -> None:
    env = _env_for(
        tmp_path,
        "--use_fsdp",
        "--fsdp_offload_params",
        "true",
        "--fsdp_sharding_strategy",
        "SHARD_GRAD_OP",
        "--fsdp_auto_wrap_policy",
        "TRANSFORMER_BASED_WRAP",
        "--fsdp-transformer-layer-cls-to-wrap",
        "Block,Head",
        "--fsdp_state_dict_type",
        "SHARDED_STATE_DICT",
        "--fsdp_activation_checkpointing",
        "true",
    )
    assert env["ACCEL_STRATEGY"] == "fsdp2"
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"]) == {
        "cpu_offload": True,
        "reshard_after_forward": False,
        "auto_wrap_policy": "transformer_based_wrap",
        "transformer_cls_names_to_wrap": ["Block", "Head"],
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": True,
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--use_fsdp", "--fsdp_version", "3"), "--fsdp_version: expected 1 or 2, got '3'"),
        (("--use_fsdp", "--fsdp_sharding_strategy", "NO_SHARD"), "use the ddp strategy, or fsdp_version 1"),
        (("--use_fsdp", "--fsdp_forward_prefetch", "true"), "--fsdp_forward_prefetch"),
        (("--fsdp_offload_params", "true"), "add --use_fsdp"),
        (("--use_fsdp", "--fsdp_state_dict_type", "LOCAL_STATE_DICT"), "FULL_STATE_DICT or SHARDED_STATE_DICT"),
    ],
)
def test_fsdp_settings_accel_cannot_honour_are_refused(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _env_for(tmp_path, *flags)


def test_fsdp_version_1_runs_fsdp1_with_its_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As `FSDP_VERSION=1` from `accelerate launch` and `fsdp_version: 1` in a config file do: FSDP1's own
    options reach its config instead of being refused or noted as under FSDP2."""
    env = _env_for(
        tmp_path,
        *("--use_fsdp", "--fsdp_version", "1", "--fsdp_offload_params", "true", "--fsdp_sharding_strategy", "NO_SHARD"),
        *("--fsdp_backward_prefetch", "BACKWARD_POST", "--fsdp_forward_prefetch", "true"),
        *("--fsdp_use_orig_params", "false", "--fsdp_sync_module_states", "true"),
    )
    assert env["ACCEL_STRATEGY"] == "fsdp2"
    assert json.loads(env["ACCEL_STRATEGY_CONFIG"]) == {
        "fsdp_version": 1,
        "cpu_offload": True,
        "sharding_strategy": "NO_SHARD",
        "backward_prefetch": "BACKWARD_POST",
        "forward_prefetch": True,
        "use_orig_params": False,
        "sync_module_states": True,
    }
    assert "fsdp" not in capsys.readouterr().err
    with pytest.raises(UsageError, match="FSDP1 \\(fsdp_version 1\\) takes a sharding strategy name here"):
        _env_for(tmp_path, "--use_fsdp", "--fsdp_version", "1", "--fsdp_reshard_after_forward", "true")


def test_prefixes_of_flags_are_not_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--fp8` (one adapter's flag) is unknown without that adapter, not an ambiguous prefix of the
    `--fp8_*` flags; `--use_deep` never silently means `--use_deepspeed`."""
    for flag in ("--fp8", "--use_deep", "--num_proc"):
        argv = ["--cpu", flag, "train.py"]
        with pytest.raises(SystemExit) as exc:
            _launch_parser(argv).parse_args(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2
        assert f"unrecognized arguments: {flag}. Flags for one vendor's hardware" in err, err
        assert "ambiguous" not in err
        assert re.search(r"no installed adapter \((.*, )?cpu(, .*)?\) declares it", err), err


class _StandIn:
    """An installed adapter that declares one of Accelerate's hardware flags."""

    @classmethod
    def add_launch_arguments(cls, group) -> None:
        group.add_argument("--tpu", action="store_true", dest="standin_tpu")

    @classmethod
    def launch_env(cls, args) -> dict[str, str]:
        return {}


def test_a_hardware_flag_declared_by_an_installed_adapter_names_it(monkeypatch, capsys, tmp_path: Path) -> None:
    from accel.adapter import registry

    script = tmp_path / "train.py"
    script.write_text("")
    # Not installed anywhere: the message lists the installed adapters and does not claim one is missing.
    argv = ["--cpu", "--tpu", str(script)]
    with pytest.raises(SystemExit):
        _launch_parser(argv).parse_args(argv)
    assert re.search(r"no installed adapter \((.*, )?cpu(, .*)?\) declares it", capsys.readouterr().err)
    installed = {**registry.installed_adapters(), "standin": _StandIn}
    monkeypatch.setattr(registry, "installed_adapters", lambda: installed)
    parser = _launch_parser(argv)
    with pytest.raises(
        UsageError, match=r"--tpu: a flag of the 'standin' adapter, but 'cpu' is selected: add --adapter"
    ):
        resolve(parser.parse_args(argv), parser)


@pytest.mark.parametrize(
    ("flag", "reason"),
    [
        (("--main_training_function", "main"), "runs the script as __main__ on every process"),
        (("--vm", "v1"), "pod launcher is not supported"),
    ],
)
def test_pod_flags_say_why(flag: tuple[str, ...], reason: str, capsys) -> None:
    argv = [*flag, "train.py"]
    with pytest.raises(SystemExit):
        _launch_parser(argv).parse_args(argv)
    assert reason in capsys.readouterr().err


def test_dynamo_flags(tmp_path: Path) -> None:
    env = _env_for(tmp_path, "--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune", "--dynamo_use_fullgraph")
    assert env["ACCEL_DYNAMO_BACKEND"] == "inductor"
    assert (env["ACCEL_DYNAMO_MODE"], env["ACCEL_DYNAMO_USE_FULLGRAPH"]) == ("max-autotune", "true")


def test_a_non_selected_adapters_flags_are_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--fakedev-lazy: a flag of the 'fakedev' adapter, but 'cpu' is selected: "):
        _env_for(tmp_path, "--fakedev-lazy")
    # Selected, the same flag reaches the workers.
    script = tmp_path / "train.py"
    argv = ["--adapter", "fakedev", "--emulate", "--fakedev-lazy", str(script)]
    parser = _launch_parser(argv)
    assert worker_env(resolve(parser.parse_args(argv), parser))["FAKEDEV_LAZY"] == "1"


def test_an_adapter_whose_flags_fail_is_left_out_unless_selected(monkeypatch, capsys, tmp_path: Path) -> None:
    from accel.adapter import registry

    class Broken:
        @classmethod
        def add_launch_arguments(cls, group) -> None:
            raise AttributeError("options module half-installed")

    installed = {**registry.installed_adapters(), "brokenflags": Broken}
    monkeypatch.setattr(registry, "installed_adapters", lambda: installed)
    parser = _launch_parser(["train.py"])
    assert parser.parse_args(["--cpu", "train.py"]).cpu is True
    assert "the 'brokenflags' adapter's flags are left out (AttributeError" in capsys.readouterr().err
    with pytest.raises(UsageError, match="the 'brokenflags' adapter's launch flags cannot be declared"):
        _launch_parser(["--adapter", "brokenflags", "train.py"])


def test_fp8_flags_become_the_recipe_defaults_of_the_workers(tmp_path: Path) -> None:
    env = _env_for(
        tmp_path,
        "--fp8_backend",
        "te",
        "--fp8_margin",
        "2",
        "--fp8_format",
        "E4M3",
        "--fp8_use_autocast_during_eval",
        "--fp8_override_linear_precision",
        "false,false,true",
        "--fp8_pad_inner_dim",
        "false",
    )
    fp8 = {k: v for k, v in env.items() if k.startswith("ACCEL_FP8_")}
    assert fp8 == {
        "ACCEL_FP8_BACKEND": "te",
        "ACCEL_FP8_MARGIN": "2",
        "ACCEL_FP8_FORMAT": "E4M3",
        "ACCEL_FP8_USE_AUTOCAST_DURING_EVAL": "true",
        "ACCEL_FP8_OVERRIDE_FPROP": "false",
        "ACCEL_FP8_OVERRIDE_DGRAD": "false",
        "ACCEL_FP8_OVERRIDE_WGRAD": "true",
        "ACCEL_FP8_PAD_INNER_DIM": "false",
    }


def test_fp8_config_in_an_accelerate_file_sets_the_recipe_defaults_and_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accel.compat.config_file import accelerate_launch_defaults
    from accel.settings.config_file import ConfigError

    for var in ("ACCEL_FP8_BACKEND", "ACCEL_FP8_AMAX_HISTORY_LEN", "ACCEL_FP8_USE_AUTOCAST_DURING_EVAL"):
        monkeypatch.setenv(var, "")  # recorded as unset, so the values the file writes are removed afterwards
        monkeypatch.delenv(var)
    monkeypatch.setenv("ACCEL_FP8_MARGIN", "5")  # already set: beats the file
    fp8 = {"backend": "AO", "margin": 1, "amax_history_length": 16, "use_autocast_during_eval": True}
    accelerate_launch_defaults({"mixed_precision": "fp8", "fp8_config": fp8}, {})
    assert os.environ["ACCEL_FP8_BACKEND"] == "AO"
    assert os.environ["ACCEL_FP8_MARGIN"] == "5"
    assert os.environ["ACCEL_FP8_AMAX_HISTORY_LEN"] == "16"
    assert os.environ["ACCEL_FP8_USE_AUTOCAST_DURING_EVAL"] == "true"
    with pytest.raises(
        ConfigError, match=r"^config: fp8_config: 'margn' is not an fp8 recipe key; accel reads backend, "
    ):
        accelerate_launch_defaults({"fp8_config": {"margn": 1}}, {})
