"""A collective that waits too long says so on every rank, then fails with the same words at the timeout.

Issue 26, item 5. Before: rank 0 calling one `gather` more than rank 1 (which went on to
`wait_for_everyone`) waited the process group's timeout (30 minutes by default) without a word,
then failed with gloo's bare "Timed out waiting 5000ms for recv operation to complete". Now each
rank prints one line after `ACCEL_COLLECTIVE_WARN_SECONDS` naming its collective, the call site and
the rank that has not arrived, and the timeout raises `CollectiveTimeoutError` with that line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from accel.errors import SettingError
from accel.settings.env import read_env
from conftest import launch

TIMEOUT = 8  # seconds; also bounds forming the group, so it leaves room for ranks that start apart

SCRIPT = f"""
import json, os, sys, time
from datetime import timedelta
from pathlib import Path
import torch
from accel import Accelerator, InitProcessGroupKwargs

out = Path(sys.argv[1])
accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds={TIMEOUT}))])
rank = accelerator.process_index
accelerator.gather(torch.ones(2))  # collective #1, on both ranks
start = time.monotonic()
try:
    if rank == 0:
        accelerator.gather(torch.ones(2))  # SITE_EXTRA
    accelerator.wait_for_everyone()  # SITE_WAIT
    result = {{"type": None}}
except Exception as exc:
    result = {{"type": type(exc).__name__, "message": str(exc)}}
result["seconds"] = time.monotonic() - start
(out / f"rank{{rank}}.json").write_text(json.dumps(result))
deadline = time.monotonic() + 60  # both ranks report before either exits (the launcher stops the other)
while len(list(out.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
os._exit(3)
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), start=1) if marker in line)


def test_extra_gather_is_reported_on_every_rank_then_times_out_naming_it(write_script, tmp_path: Path) -> None:
    script = write_script(SCRIPT)
    proc = launch(script, str(tmp_path), env={"ACCEL_COLLECTIVE_WARN_SECONDS": "1"}, timeout=120, check=False)
    reports = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(reports) == [0, 1], proc.stderr[-3000:]
    site = r"\S*worker\.py:{}"  # relative to the working directory, or absolute outside it
    extra, wait = site.format(_line("SITE_EXTRA")), site.format(_line("SITE_WAIT"))
    expected = {
        0: rf"rank 0 {{}} in `gather` \(accel collective #2\) at {extra}; not arrived: rank 1 \(waits in "
        rf"`wait_for_everyone` #2 at {wait}\)",
        1: rf"rank 1 {{}} in `wait_for_everyone` \(accel collective #2\) at {wait}; not arrived: rank 0 \(waits in "
        rf"`gather` #2 at {extra}\)",
    }
    for rank, pattern in expected.items():
        warned = [line for line in proc.stderr.splitlines() if line.startswith(f"accel: rank {rank} has waited")]
        assert len(warned) == 1, proc.stderr[-3000:]  # one line per rank, not one per check
        assert re.fullmatch(
            "accel: "
            + pattern.format("has waited 1 s")
            + rf"; still waiting, up to the process group's timeout \({TIMEOUT} s\)",
            warned[0],
        ), warned[0]
        report = reports[rank]
        assert report["type"] == "CollectiveTimeoutError", report
        message = report["message"]
        assert re.match(pattern.format(f"timed out after {TIMEOUT} s"), message), message
        assert f"(the process group's timeout is {TIMEOUT} s; backend: Timed out waiting" in message
        assert message.endswith("(`accel launch --debug` names the first mismatch)") and "\n" not in message
        assert TIMEOUT - 0.5 <= report["seconds"] < TIMEOUT + 6, report  # the configured timeout, not 30 minutes
    assert "DistBackendError" not in proc.stderr and "unbound_buffer.cc" not in proc.stderr


@pytest.mark.parametrize(("value", "seconds"), [(None, 60.0), ("2.5", 2.5), ("0", 0.0)])
def test_warn_seconds_from_the_environment(value: str | None, seconds: float) -> None:
    env = {} if value is None else {"ACCEL_COLLECTIVE_WARN_SECONDS": value}
    assert read_env(env).collective_warn_seconds == seconds


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_bad_warn_seconds_are_refused_by_name(value: str) -> None:
    with pytest.raises(SettingError) as caught:
        read_env({"ACCEL_COLLECTIVE_WARN_SECONDS": value}).collective_warn_seconds  # noqa: B018
    assert str(caught.value) == (
        "ACCEL_COLLECTIVE_WARN_SECONDS: expected a number of seconds >= 0 (0 turns the stuck-collective warning "
        f"off), got {value!r}"
    )
    assert re.fullmatch(r"[^\n]+", str(caught.value))
