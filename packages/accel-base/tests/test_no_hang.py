"""A collective that cannot complete ends with an error, not a hang.

Two ways a 2-rank job goes wrong: a rank exits while the other waits in `gather`; a
rank never reaches the collective (the configured timeout must end the wait, not the
30-minute default). Ranks that pass different shapes or dtypes, or make different numbers
of calls, are debug mode's (test_debug_mode.py). Every launch has a subprocess timeout far above
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
    # A closed connection is the backend's error; a wait that ran into the timeout is the watchdog's (a RuntimeError).
    assert report["type"] in ("RuntimeError", "CollectiveTimeoutError")
    # Which of these gloo reports depends on where the peer's socket was when it closed.
    assert re.search(r"Connection (closed|reset) by peer|Timed out", report["message"]), report["message"]
    assert report["seconds"] < 10 + 3


def test_absent_rank_times_out_after_configured_timeout(write_script, tmp_path: Path) -> None:
    proc, reports = _run(write_script, tmp_path, "stuck", env={"ACCEL_TIMEOUT": "8"})
    assert proc.returncode != 0
    report = reports[0]
    assert report["timeout"] == 8.0
    assert report["type"] == "CollectiveTimeoutError"  # the watchdog's (test_collective_watchdog.py), not gloo's
    assert "rank 0 timed out after 8 s in `gather`" in report["message"]
    assert "not arrived: rank 1 (not in an accel collective)" in report["message"]
    assert "backend: Timed out waiting 8000ms" in report["message"]
    # Ended by the configured timeout: not earlier, and not by the 30-minute default.
    assert 7.5 <= report["seconds"] < 8 + 6


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
