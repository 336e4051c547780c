"""A collective that cannot complete ends with an error, not a hang.

Three ways a 2-rank job goes wrong: a rank exits while the other waits in `gather`; a
rank never reaches the collective (the configured timeout must end the wait, not the
30-minute default); ranks pass different shapes (debug mode names each rank's shape on
every rank, and the group stays usable). Every launch has a subprocess timeout far above
the collective timeout, so a hang fails the test instead of stalling it. The collective
timeouts (8-10 s) leave room for ranks that start seconds apart on a loaded machine: the
same timeout bounds forming the group.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from accel import InitProcessGroupKwargs
from accel.state import PartialState
from conftest import launch

SCRIPT = """
import json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch
from accel import Accelerator, InitProcessGroupKwargs
from accel.errors import CollectiveMismatchError

mode, out = sys.argv[1], Path(sys.argv[2])
handlers = [InitProcessGroupKwargs(timeout=timedelta(seconds=10))] if mode == "dead" else []
accelerator = Accelerator(kwargs_handlers=handlers)
rank = accelerator.process_index

def report(**data):
    (out / f"rank{rank}.json").write_text(json.dumps(data))

def attempt(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"type": None, "seconds": time.monotonic() - start}

if mode == "dead":
    if rank == 1:
        os._exit(0)  # a clean exit: the launcher keeps waiting for rank 0, only the collective can end it
    result = attempt(lambda: accelerator.gather(torch.zeros(2, 3)))
    report(timeout=accelerator.state.timeout.total_seconds(), **result)
    os._exit(3)
elif mode == "stuck":
    if rank == 1:
        # Alive but never joins the collective; leaves once rank 0 has given up.
        deadline = time.monotonic() + 120
        while not (out / "rank0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os._exit(0)
    result = attempt(lambda: accelerator.gather(torch.zeros(2, 3)))
    report(timeout=accelerator.state.timeout.total_seconds(), **result)
    os._exit(3)
else:
    results = {
        "gather": attempt(lambda: accelerator.gather(torch.zeros(2 + rank, 3))),
        "reduce": attempt(lambda: accelerator.reduce(torch.zeros(4 + rank))),
        "broadcast": attempt(lambda: accelerator.broadcast(torch.zeros(1, 2 + rank))),
    }
    # The check itself is a collective that every rank completes: the group still works.
    results["after"] = accelerator.gather(torch.tensor([rank])).tolist()
    report(**results)
"""


def _run(write_script, tmp_path: Path, mode: str, env: dict[str, str] | None = None):
    script = write_script(SCRIPT)
    proc = launch(script, mode, str(tmp_path), env=env, timeout=120, check=False)
    reports = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    return proc, reports


def test_dead_rank_ends_collective_with_error(write_script, tmp_path: Path) -> None:
    proc, reports = _run(write_script, tmp_path, "dead", env={"ACCEL_TIMEOUT": "1800"})
    assert proc.returncode != 0
    assert list(reports) == [0], proc.stderr[-3000:]
    report = reports[0]
    assert report["timeout"] == 10.0  # InitProcessGroupKwargs wins over ACCEL_TIMEOUT
    assert report["type"] == "RuntimeError"
    # Which of these gloo reports depends on where the peer's socket was when it closed.
    assert re.search(r"Connection (closed|reset) by peer|Timed out", report["message"]), report["message"]
    assert report["seconds"] < 10 + 3


def test_absent_rank_times_out_after_configured_timeout(write_script, tmp_path: Path) -> None:
    proc, reports = _run(write_script, tmp_path, "stuck", env={"ACCEL_TIMEOUT": "8"})
    assert proc.returncode != 0
    report = reports[0]
    assert report["timeout"] == 8.0
    assert report["type"] == "RuntimeError"
    assert "Timed out waiting 8000ms" in report["message"]
    # Ended by the configured timeout: not earlier, and not by the 30-minute default.
    assert 7.5 <= report["seconds"] < 8 + 6


def test_debug_mode_names_each_ranks_shape(write_script, tmp_path: Path) -> None:
    proc, reports = _run(write_script, tmp_path, "mismatch", env={"ACCEL_DEBUG_MODE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(reports) == [0, 1]
    expected = {
        "gather": ("[2, 3]", "[3, 3]"),
        "reduce": ("[4]", "[5]"),
        "broadcast": ("[1, 2]", "[1, 3]"),
    }
    for rank, report in reports.items():
        for op, (shape0, shape1) in expected.items():
            result = report[op]
            assert result["type"] == "CollectiveMismatchError", (rank, op, result)
            assert f"Cannot apply `{op}`" in result["message"]
            assert f"rank 0: {shape0}" in result["message"] and f"rank 1: {shape1}" in result["message"]
            assert "pad_across_processes" in result["message"]
        assert report["after"] == [0, 1]


# ---- where the timeout comes from (one process) --------------------------------------------
def test_timeout_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TIMEOUT", "7.5")
    assert PartialState().timeout == timedelta(seconds=7.5)


def test_timeout_kwargs_beat_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TIMEOUT", "7")
    state = PartialState(init_kwargs=InitProcessGroupKwargs(timeout=timedelta(seconds=3)))
    assert state.timeout == timedelta(seconds=3)


@pytest.mark.parametrize("value", ["soon", "-1", "0"])
def test_bad_timeout_env_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ACCEL_TIMEOUT", value)
    with pytest.raises(ValueError, match=rf"ACCEL_TIMEOUT={value!r}.*positive number of seconds"):
        PartialState()
