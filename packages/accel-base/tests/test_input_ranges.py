"""Every environment variable and config value is checked at the edge, with one line naming it (issue 26, item 6).

Before: `WORLD_SIZE=0` or `-2` ran as zero processes, `WORLD_SIZE=abc` and `RANK >= WORLD_SIZE` gave a bare
`ValueError`/`IndexError`; a deeply nested YAML config a 3,000-line `RecursionError`, a non-UTF-8 one a
`UnicodeDecodeError`, a YAML alias bomb kept `accel launch` busy past 30 s; an Accelerate config with
`num_processes: two` silently ran one process; a `main_process_ip` holding `;` a 28-line torch traceback.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from accel import Accelerator
from accel.cli import main
from accel.errors import SettingError
from accel.settings.env import read_env

LAUNCHER = "; it comes from the launcher (torchrun, accel launch, srun, mpirun): launch through one, or fix or unset the variable"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE: expected an integer >= 1 (the number of processes), got '0'"),
        ({"WORLD_SIZE": "-2", "RANK": "0"}, "WORLD_SIZE: expected an integer >= 1 (the number of processes), got '-2'"),
        (
            {"WORLD_SIZE": "abc", "RANK": "0"},
            "WORLD_SIZE: expected an integer >= 1 (the number of processes), got 'abc'",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "2"},
            "RANK: expected an integer from 0 to 1 (this process's rank; WORLD_SIZE=2), got '2'",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "-1"},
            "RANK: expected an integer from 0 to 1 (this process's rank; WORLD_SIZE=2), got '-1'",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "4"},
            "LOCAL_WORLD_SIZE: expected an integer from 1 to 2 (processes on this node; WORLD_SIZE=2), got '4'",
        ),
        (
            {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2"},
            "LOCAL_RANK: expected an integer from 0 to 1 (this process's index on its node), got '2'",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "-1"},
            "LOCAL_RANK: expected an integer >= 0 (this process's index on its node), got '-1'",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "70000"},
            "MASTER_PORT: expected an integer from 1 to 65535 (a TCP port), got '70000'",
        ),
        (
            {"SLURM_NTASKS": "2", "SLURM_PROCID": "5"},
            "SLURM_PROCID: expected an integer from 0 to 1 (this process's rank; SLURM_NTASKS=2), got '5'",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "0"},
            "OMPI_COMM_WORLD_SIZE: expected an integer >= 1 (the number of processes), got '0'",
        ),
    ],
)
def test_launcher_variables_out_of_range_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_env(env)
    assert str(caught.value) == message + LAUNCHER


@pytest.mark.parametrize("addr", ["10.0.0.1;reboot", "two words", "a/b", "-lead.example"])
def test_master_addr_that_is_no_host_is_named(addr: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_env({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": addr})
    assert str(caught.value) == f"MASTER_ADDR: expected a host name or an IP address of the main node, got {addr!r}"


@pytest.mark.parametrize("addr", ["10.0.0.1", "::1", "[fe80::1]", "node-07.cluster.local", "gpu_node3", "localhost"])
def test_real_hosts_pass(addr: str) -> None:
    assert read_env({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": addr}).launch.master_addr == addr


def test_local_rank_alone_may_pick_a_device() -> None:
    # Without LOCAL_WORLD_SIZE only a negative LOCAL_RANK is known wrong: one process may be pinned to device 3.
    assert read_env({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "3"}).launch.local_rank == 3


def test_one_process_run_ignores_the_rendezvous_variables() -> None:
    # Without a launcher nothing reads them (as before): a stray MASTER_PORT does not stop a one-process script.
    assert read_env({"MASTER_PORT": "0", "MASTER_ADDR": "x;y"}).launch.world_size == 1


def test_world_size_zero_is_refused_by_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before: an Accelerator with num_processes == 0, whose loaders yielded every batch on every "rank".
    monkeypatch.setenv("WORLD_SIZE", "0")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SettingError, match=r"^WORLD_SIZE: expected an integer >= 1"):
        Accelerator(cpu=True)


# ---- config files and launch flags: one line on stderr, exit code 2 ---------------------------------
@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('ran')\n")
    return path


def _launch_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["launch", *argv]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("accel: installed adapter")]
    assert len(lines) == 1, lines
    return lines[0]


ACCELERATE = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10 if prev else ['x'] * 10)}]\n"
    for prev, name in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh")
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ACCELERATE + "num_processes: two\n", "{path}:3: num_processes: expected an integer, got 'two'"),
        (ACCELERATE + "num_processes: 0\n", "{path}:3: num_processes: expected an integer >= 1, got 0"),
        (ACCELERATE + "num_machines: 0\n", "{path}:3: num_machines: expected an integer >= 1, got 0"),
        (
            ACCELERATE + "num_machines: 2\nmachine_rank: 2\nnum_processes: 2\n",
            "{path}:4: machine_rank: expected 0 <= machine_rank < num_machines (2), got 2",
        ),
        (
            ACCELERATE + "main_process_ip: 10.0.0.1;touch pwned\n",
            "{path}:3: main_process_ip: expected a host name or an IP address of the main node, got "
            "'10.0.0.1;touch pwned'",
        ),
        (
            ACCELERATE + "main_process_port: 70000\n",
            "{path}:3: main_process_port: expected a port number from 1 to 65535, got 70000",
        ),
        (
            "main_process_ip: 'a b'\n",
            "{path}:1: main_process_ip: expected a host name or an IP address of the main node, got 'a b'",
        ),
        ("main_process_port: 0\n", "{path}:1: main_process_port: expected a port number from 1 to 65535, got 0"),
        (
            "a: " + "[" * 5000 + "]" * 5000 + "\n",
            "{path}:1: nested more than 32 levels deep; a config file holds a few levels of keys",
        ),
        (
            ACCELERATE + BOMB + "dynamo_config:\n  dynamo_backend: *h\n",
            "{path}:7: holds more than 100000 values once its aliases (*name) are expanded; write the values out, "
            "or remove the aliases",
        ),
        (
            ACCELERATE + BOMB + "fsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: *h\n",
            "{path}:7: holds more than 100000 values once its aliases (*name) are expanded; write the values out, "
            "or remove the aliases",
        ),
        ("strategy: ddp\nnum_processes: 2\nmixed_precision: \udce9t\udce9\n", None),
    ],
    ids=[
        "num_processes_two",
        "num_processes_zero",
        "num_machines_zero",
        "machine_rank",
        "accelerate_ip",
        "accelerate_port",
        "accel_ip",
        "accel_port",
        "deep",
        "bomb_dynamo",
        "bomb_fsdp",
        "latin1",
    ],
)
def test_bad_config_files_are_one_line_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, script: Path, text: str, expected: str | None
) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # the last case: Latin-1 bytes, not UTF-8
    if expected is None:
        expected = "{path}:3: not UTF-8 text (byte 0xe9 at offset 48); save the file as UTF-8"
    start = time.monotonic()
    line = _launch_error(capsys, "--config-file", str(path), str(script))
    assert line == "accel launch: error: " + expected.format(path=path)
    assert time.monotonic() - start < 10  # the alias bomb is refused, not expanded


def test_accelerate_num_processes_minus_one_means_unset(tmp_path: Path) -> None:
    # Accelerate's own ClusterConfig default (-1: not given) keeps its meaning: one per device.
    from accel.compat.config_file import accelerate_launch_defaults

    out, _ = accelerate_launch_defaults({"distributed_type": "MULTI_CPU", "num_processes": -1}, {})
    assert "num_processes" not in out


@pytest.mark.parametrize("addr", ["10.0.0.1;touch pwned", "host name"])
def test_main_process_ip_flag_is_checked(capsys: pytest.CaptureFixture[str], script: Path, addr: str) -> None:
    line = _launch_error(capsys, "--main-process-ip", addr, "--num-processes", "2", str(script))
    assert line == (
        f"accel launch: error: --main-process-ip: expected a host name or an IP address of the main node, got {addr!r}"
    )
