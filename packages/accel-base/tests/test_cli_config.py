"""`accel config` and config files: accel's typed YAML file, and Accelerate's own files read as they are
(fixtures/accelerate: written by Accelerate 1.15.0)."""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from accel.adapter.registry import select_adapter
from accel.cli import _launch_parser, build_torchrun_argv, main, worker_env
from accel.commands import UsageError
from accel.commands.launch_resolve import resolve
from accel.compat.config_file import accelerate_launch_defaults
from accel.settings.config_file import AccelConfig, ConfigError, default_config_path, load_accel_config, read_yaml

FIXTURES = Path(__file__).parent / "fixtures" / "accelerate"


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cfg" / "accel.yaml"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(path))
    return path


def test_default_location_is_documented(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ACCEL_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "accel" / "default_config.yaml"
    monkeypatch.setenv("ACCEL_CONFIG_FILE", "~/x.yaml")
    assert default_config_path() == Path.home() / "x.yaml"


def test_config_default_writes_a_file_launch_reads(config_path: Path) -> None:
    assert main(["config", "default", "--mixed-precision", "bf16", "--num_processes", "2"]) == 0
    config = load_accel_config(config_path)
    assert config == AccelConfig(mixed_precision="bf16", num_processes=2)
    assert main(["config", "default"]) == 1  # never overwritten silently
    assert main(["config", "default", "--force"]) == 0
    assert load_accel_config(config_path) == AccelConfig()


def test_config_update_changes_only_the_keys_given(config_path: Path) -> None:
    main(["config", "default", "--mixed-precision", "bf16"])
    assert (
        main(["config", "update", "--gradient-accumulation-steps", "4", "--strategy-config", '{"zero_stage": 3}']) == 0
    )
    assert load_accel_config(config_path) == AccelConfig(
        mixed_precision="bf16", gradient_accumulation_steps=4, strategy_config={"zero_stage": 3}
    )
    assert main(["config", "update", "--num-processes", "two"]) == 2
    assert main(["config", "update", "--mixed-precision", "fp64"]) == 2


def test_questions_on_a_terminal(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["", "", "three", "3", "", "", "", "", "", "fp16"] + [""] * 20)
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(answers))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    assert main(["config", "--debug", "true"]) == 0  # a flag answers its question
    assert load_accel_config(config_path) == AccelConfig(num_processes=3, mixed_precision="fp16", debug=True)


def test_questions_show_their_choices_and_reask_a_bad_answer_on_a_real_terminal(config_path: Path) -> None:
    """Through a pseudo-terminal: each bad answer is refused as it is given and asked again; no answer is lost."""
    import pexpect

    child = pexpect.spawn(
        sys.executable, ["-m", "accel.cli", "config"], env=dict(os.environ), encoding="utf-8", timeout=60
    )
    bad = {"num_processes": ["two", "0", "2"], "rdzv_backend": ["bogus", "c10d"], "mixed_precision": ["bf17", "bf16"]}
    seen: dict[str, str] = {}
    while True:
        index = child.expect([r"\n  (\w+)( \([^)]*\))? \[[^\]]*\]: ", pexpect.EOF])
        if index == 1:
            break
        name, choices = child.match.group(1), child.match.group(2) or ""
        seen.setdefault(name, choices)
        answers = bad.get(name, [""])
        child.sendline(answers.pop(0) if len(answers) > 1 else answers[0])
    child.close()
    assert child.exitstatus == 0, child.before
    assert seen["mixed_precision"] == " (no/bf16/fp16/fp8)"
    assert seen["rdzv_backend"] == " (c10d/static/etcd/etcd-v2)"
    assert "cpu" in seen["adapter"] and "ddp" in seen["strategy"] and seen["debug"] == " (yes/no)"
    assert load_accel_config(config_path) == AccelConfig(num_processes=2, rdzv_backend="c10d", mixed_precision="bf16")


def test_a_bad_rendezvous_backend_is_refused_when_written(config_path: Path) -> None:
    main(["config", "default"])
    assert main(["config", "update", "--rdzv-backend", "bogus"]) == 2
    assert load_accel_config(config_path) == AccelConfig()  # the file is unchanged


def test_without_a_terminal_no_question_is_asked(config_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "config", "--num-processes", "2"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert proc.returncode == 0, proc.stderr
    assert load_accel_config(config_path) == AccelConfig(num_processes=2)


def test_schema_describes_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert set(schema["properties"]) == {f.name for f in dataclasses.fields(AccelConfig)}
    assert schema["properties"]["num_processes"]["type"] == ["integer", "null"]
    assert schema["properties"]["mixed_precision"]["enum"] == ["no", "bf16", "fp16", "fp8"]
    assert all(p["description"] for p in schema["properties"].values())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mixed_precision: bf16\nnum_procs: 2\n", r":2: unknown key 'num_procs'; accel config files take adapter"),
        ("debug: false\nnum_processes: two\n", r":2: num_processes: expected an integer, got 'two'"),
        ("num_machines: 2\nmachine_rank: 2\n", r":2: machine_rank: expected 0 <= machine_rank < num_machines \(2\)"),
        ("debug: false\nmixed_precision: bf16: fp16\n", r":2: not valid YAML \(mapping values are not allowed"),
        ("- a\n- b\n", r"holds a mapping of keys to values"),
    ],
)
def test_errors_name_the_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_accel_config(path)


def _launch_args(tmp_path: Path, *flags: str):
    script = tmp_path / "train.py"
    script.write_text("")
    argv = [*flags, str(script)]
    parser = _launch_parser(argv)
    return resolve(parser.parse_args(argv), parser)


def test_flags_win_over_the_file(config_path: Path, tmp_path: Path) -> None:
    main(["config", "default", "--mixed-precision", "bf16", "--num-processes", "2", "--adapter", "cpu"])
    args = _launch_args(tmp_path, "--mixed_precision", "fp16")
    assert (args.mixed_precision, args.num_processes) == ("fp16", 2)
    assert worker_env(args)["ACCEL_MIXED_PRECISION"] == "fp16"


def expected_from_fixture(name: str) -> dict[str, object]:
    data, lines = read_yaml(FIXTURES / name)
    return accelerate_launch_defaults(data, lines)[0]


def test_accelerate_files_map_key_by_key() -> None:
    base = {"nnodes": "1", "node_rank": 0, "rdzv_backend": "static"}
    assert expected_from_fixture("default_config.yaml") == {
        **base,
        "mixed_precision": "no",
        "cpu": True,
        "num_processes": 1,
    }
    assert expected_from_fixture("multi_cpu.yaml") == {
        **base,
        "mixed_precision": "bf16",
        "cpu": True,
        "num_processes": 2,
        "master_port": 29511,
    }
    assert expected_from_fixture("fsdp2.yaml") == {
        **base,
        "mixed_precision": "bf16",
        "num_processes": 2,
        "strategy": "fsdp2",
        "strategy_kwargs": {
            "activation_checkpointing": False,
            "auto_wrap_policy": "transformer_based_wrap",
            "cpu_offload": False,
            "cpu_ram_efficient_loading": True,  # the file's fsdp_cpu_ram_efficient_loading, honoured on FSDP2
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "transformer_cls_names_to_wrap": ["Block"],
        },
    }
    assert expected_from_fixture("deepspeed.yaml") == {
        **base,
        "mixed_precision": "bf16",
        "num_processes": 2,
        "strategy": "deepspeed",
        "gradient_accumulation_steps": 4,
        "strategy_kwargs": {
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
            "zero3_init_flag": False,
            "zero_stage": 2,
        },
    }
    multi = expected_from_fixture("multi_hpu.yaml")  # two machines of 4: Accelerate's 8 is the total
    assert (multi["nnodes"], multi["node_rank"], multi["num_processes"]) == ("2", 1, 4)
    assert (multi["master_addr"], multi["master_port"], multi["rdzv_backend"]) == ("10.0.0.1", 29500, "c10d")
    assert multi["required_hardware"] == "MULTI_HPU"
    gpu = expected_from_fixture("multi_gpu.yaml")
    assert (gpu["dynamo_backend"], gpu["dynamo_mode"], gpu["dynamo_use_fullgraph"]) == ("inductor", "default", False)


def test_an_fsdp1_file_runs_fsdp1_with_its_options_as_accelerate_does() -> None:
    data, lines = read_yaml(FIXTURES / "fsdp1.yaml")
    values, notes = accelerate_launch_defaults(data, lines)
    assert values["strategy"] == "fsdp2"
    assert values["strategy_kwargs"] == {
        "fsdp_version": 1,
        "auto_wrap_policy": "size_based_wrap",
        "backward_prefetch": "BACKWARD_PRE",
        "forward_prefetch": False,
        "min_num_params": 100000,
        "cpu_offload": True,
        "sharding_strategy": "FULL_SHARD",
        "state_dict_type": "FULL_STATE_DICT",
        "sync_module_states": True,
        "use_orig_params": True,
    }
    assert not [n for n in notes if "fsdp" in n], notes
    data["fsdp_config"]["fsdp_version"] = 3
    with pytest.raises(ConfigError, match=r"fsdp1.yaml:16: fsdp_config.fsdp_version: expected 1 or 2, got 3"):
        accelerate_launch_defaults(data, lines)


def test_the_tpu_file_loads_and_its_pod_keys_are_named_once() -> None:
    """Without an adapter for distributed_type XLA installed, its hardware keys are ignored with one note."""
    data, lines = read_yaml(FIXTURES / "xla.yaml")
    values, notes = accelerate_launch_defaults(data, lines)
    assert values["required_hardware"] == "XLA" and values["num_processes"] == 8
    ignored = [n for n in notes if "ignored" in n]
    assert len(ignored) == 1 and ignored[0].startswith("tpu_use_sudo: ignored (no adapter for distributed_type XLA")
    data.update(tpu_name="pod-1", tpu_zone="us-central2-b", commands=["pip install x"])
    notes = accelerate_launch_defaults(data, lines)[1]
    assert [n.split(": ignored")[0] for n in notes if "ignored" in n] == ["tpu_use_sudo, tpu_name, tpu_zone, commands"]
    # In a file for no one vendor's hardware, an unknown key stays an error.
    with pytest.raises(ConfigError, match=r"tpu_use_sudo: accel has no equivalent; remove the key"):
        accelerate_launch_defaults({**data, "distributed_type": "MULTI_CPU"}, lines)


def test_an_installed_adapter_declares_its_hardwares_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter whose data_parallel_name is the file's distributed_type says which keys are harmless
    and which it refuses (the core names no hardware)."""
    from accel.adapter import registry
    from accel.adapter.cpu import CPUAdapter

    class StandIn(CPUAdapter):
        name = "standin"
        data_parallel_name = "XLA"
        accelerate_config_keys = {"tpu_use_sudo": None, "tpu_use_cluster": "run accel launch on each host"}

    installed = {**registry.installed_adapters(), "standin": StandIn}
    monkeypatch.setattr(registry, "installed_adapters", lambda: installed)
    data, lines = read_yaml(FIXTURES / "xla.yaml")
    notes = accelerate_launch_defaults(data, lines)[1]
    assert any(n.startswith("tpu_use_sudo: ignored (the standin adapter calls them harmless)") for n in notes)
    with pytest.raises(ConfigError, match=r"xla.yaml:\d+: tpu_use_cluster: run accel launch on each host"):
        accelerate_launch_defaults({**data, "tpu_use_cluster": True}, lines)
    with pytest.raises(ConfigError, match=r"tpu_zone: accel has no equivalent \(nor does the standin adapter"):
        accelerate_launch_defaults({**data, "tpu_zone": "z"}, lines)


def test_an_adapter_reads_its_own_accelerate_section_under_any_distributed_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Adapter.accelerate_config_settings` (a CPU extension's section in a MULTI_CPU file) and
    `Adapter.accelerate_env`; a section whose keys all hold their defaults asks for nothing."""
    from accel.adapter import registry
    from accel.adapter.cpu import CPUAdapter
    from accel.compat.env import apply_accelerate_env

    data = {"distributed_type": "MULTI_CPU", "use_cpu": True, "ext_config": {"ext": False}}
    assert accelerate_launch_defaults(data, {})[0] == {"cpu": True}  # no adapter reads it: all defaults, nothing
    with pytest.raises(ConfigError, match=r"ext_config: accel has no equivalent"):
        accelerate_launch_defaults({**data, "ext_config": {"ext": True}}, {})

    class CPUExtension(CPUAdapter):
        name = "cpuext"
        accelerate_env = {"ACCELERATE_USE_EXT": "ACCEL_EXT_ON"}

        @classmethod
        def accelerate_config_settings(cls, key: str, value: object) -> dict[str, object] | None:
            if key != "ext_config":
                return None
            if not isinstance(value, dict) or not isinstance(value.get("ext"), bool):
                raise ValueError("ext: expected true or false")
            return {"adapter": "cpuext"} if value["ext"] else {}

    installed = {**registry.installed_adapters(), "cpuext": CPUExtension}
    monkeypatch.setattr(registry, "installed_adapters", lambda: installed)
    on = accelerate_launch_defaults({**data, "ext_config": {"ext": True}}, {"ext_config": "c.yaml:3"})[0]
    assert on == {"cpu": True, "adapter": "cpuext"}
    with pytest.raises(ConfigError, match=r"^c.yaml:3: ext_config: ext: expected true or false$"):
        accelerate_launch_defaults({**data, "ext_config": {"ext": "x"}}, {"ext_config": "c.yaml:3"})
    env = {"ACCELERATE_USE_EXT": "false"}
    assert apply_accelerate_env(env) == [] and env["ACCEL_EXT_ON"] == "false"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "debug: false\nadapter: nosuch\n",
            r"c.yaml:2: adapter: no installed adapter is named 'nosuch'; installed: (.*, )?cpu",
        ),
        ("debug: false\nstrategy: foo\n", r"c.yaml:2: strategy: no accel strategy is named 'foo'; installed: ddp"),
        (
            "strategy: fsdp2\nstrategy_config:\n  cpu_offload: true\n  bogus_field: 1\n",
            r"c.yaml:4: strategy_config.bogus_field: not a field of FSDPConfig \(the fsdp2 strategy's config\)",
        ),
        (
            "strategy: fsdp2\nstrategy_config:\n  state_dict_type: WRONG\n",
            r"c.yaml:3: strategy_config.state_dict_type: state_dict_type must be one of",
        ),
    ],
)
def test_names_and_strategy_fields_are_checked_with_their_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_accel_config(path)
    for command in (["config", "show", "--config-file", str(path)], ["launch", "--config_file", str(path), "t.py"]):
        proc = subprocess.run(
            [sys.executable, "-m", "accel.cli", *command], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "__init__()" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and f"{path}:" in proc.stderr, proc.stderr


def test_megatron_file_maps_onto_the_plugin_or_says_what_to_install() -> None:
    data, lines = read_yaml(FIXTURES / "megatron.yaml")
    try:
        import accel_megatron  # noqa: F401
    except ImportError:
        with pytest.raises(
            ConfigError, match=r"megatron.yaml:\d+: megatron_lm_config.*pip install 'accel-megatron\[megatron\]'"
        ):
            accelerate_launch_defaults(data, lines)
        return
    values, _ = accelerate_launch_defaults(data, lines)
    assert values["strategy"] == "megatron"
    assert values["strategy_kwargs"]["tp_degree"] == 2 and values["strategy_kwargs"]["pp_degree"] == 2


def test_hardware_type_without_its_adapter_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCEL_ADAPTER", raising=False)
    monkeypatch.delenv("ACCEL_TEST_FAKEDEV", raising=False)
    if select_adapter(None).name != "cpu":
        pytest.skip("an accelerator adapter is available here: the file's hardware request is met")
    with pytest.raises(UsageError, match="asks for distributed_type MULTI_GPU, but no adapter for that hardware"):
        _launch_args(tmp_path, "--config_file", str(FIXTURES / "multi_gpu.yaml"))
    # The command line choosing the CPU wins over the file.
    args = _launch_args(tmp_path, "--config_file", str(FIXTURES / "multi_gpu.yaml"), "--cpu")
    assert build_torchrun_argv(args)[:2] == ["--nproc-per-node", "8"]


def test_launch_with_an_accelerate_config_file(tmp_path: Path) -> None:
    """`accel launch --config_file` on the file `accelerate config` wrote for 2 CPU processes in bf16."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    config = tmp_path / "multi_cpu.yaml"
    config.write_text((FIXTURES / "multi_cpu.yaml").read_text().replace("29511", str(port)))
    probe = tmp_path / "probe.py"
    # Each rank writes its own file: two ranks printing to one pipe can interleave within a line.
    probe.write_text(
        "import json, os, sys\nfrom accel import Accelerator\nacc = Accelerator()\n"
        "row = [acc.process_index, acc.num_processes, acc.mixed_precision, os.environ['MASTER_PORT']]\n"
        "open(os.path.join(sys.argv[1], f'rank{acc.process_index}.json'), 'w').write(json.dumps(row))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("ACCEL_ADAPTER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "accel.cli", "launch", "--config_file", str(config), str(probe), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = sorted(json.loads(path.read_text()) for path in tmp_path.glob("rank*.json"))
    assert rows == [[0, 2, "bf16", str(port)], [1, 2, "bf16", str(port)]]


@pytest.mark.parametrize(
    ("name", "processes", "strategy", "note"),
    [
        ("fsdp1.yaml", "2", "fsdp2", None),
        ("xla.yaml", "1", "ddp", "tpu_use_sudo: ignored ("),
    ],
)
def test_accelerate_files_accel_once_refused_now_launch(
    tmp_path: Path, name: str, processes: str, strategy: str, note: str | None
) -> None:
    """`accel launch --config_file` on Accelerate's FSDP1 and TPU files (on this CPU): the workers run, the
    launcher's note is printed once (the FSDP1 file runs FSDP1, with no note)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json, os, sys\nfrom accel import Accelerator\nacc = Accelerator()\n"
        "config = getattr(acc.strategy, 'config', None)\n"
        "row = [acc.num_processes, acc.state.strategy_name, getattr(config, 'cpu_offload', None),\n"
        "       type(acc.strategy).__name__]\n"
        "open(os.path.join(sys.argv[1], f'rank{acc.process_index}.json'), 'w').write(json.dumps(row))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCEL_ADAPTER", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "accel.cli",
            "launch",
            "--config_file",
            str(FIXTURES / name),
            "--cpu",
            "--num_processes",
            processes,
            str(probe),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert note is None or proc.stderr.count(note) == 1, proc.stderr[-3000:]
    assert "fsdp_version" not in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    # The file's fsdp_offload_params and fsdp_version reached FSDPConfig.
    expected = [True, "FSDP1Strategy"] if name == "fsdp1.yaml" else [None, "DDPStrategy"]
    assert rows == [[int(processes), strategy, *expected]] * int(processes)
