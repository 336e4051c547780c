"""Debug mode catches shape, dtype and device mismatches and a different number of collective calls.

Issue 14, item 6. Before: rank 0 reducing float32 while rank 1 reduced int32 of the same shape returned wrong
numbers on both ranks and exit 0; a rank calling `gather` once more than the other waited for
the full collective timeout (30 minutes by default). Every launch below keeps that default
timeout (except the one that tests the timeout itself) and has a subprocess limit of a few
minutes, so a hang fails the test instead of stalling it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import launch

SCRIPT = """
import json, os, sys, time
import torch
import torch.distributed as dist
from accel import Accelerator

mode, out = sys.argv[1], sys.argv[2]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index

def report(**data):
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(data, f)

def attempt(fn):
    start = time.monotonic()
    try:
        fn()
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"type": None, "seconds": time.monotonic() - start}

if mode == "mismatch":
    dtype = torch.float32 if rank == 0 else torch.int32
    x = torch.ones(4, dtype=dtype)
    results = {
        "gather": attempt(lambda: accelerator.gather(x)),
        "reduce": attempt(lambda: accelerator.reduce(x)),
        "broadcast": attempt(lambda: accelerator.broadcast(x)),
        "pad_across_processes": attempt(lambda: accelerator.pad_across_processes(x[: 2 + rank])),
        "gather_for_metrics": attempt(lambda: accelerator.gather_for_metrics(x)),
        "nest": attempt(lambda: accelerator.reduce({"a": torch.zeros(2), "b": torch.zeros(3, dtype=dtype)})),
        "both": attempt(lambda: accelerator.gather(torch.zeros(2 + rank, dtype=dtype))),
        "ndim": attempt(lambda: accelerator.pad_across_processes(torch.zeros([2] * (1 + rank)))),
        "device": attempt(lambda: accelerator.gather(torch.ones(4, device="meta" if rank else "cpu"))),
        "shape_gather": attempt(lambda: accelerator.gather(torch.zeros(2 + rank, 3))),
        "shape_reduce": attempt(lambda: accelerator.reduce(torch.zeros(4 + rank))),
        "shape_broadcast": attempt(lambda: accelerator.broadcast(torch.zeros(1, 2 + rank))),
    }
    # Matching calls still work afterwards, and pad still pads ragged sizes of one dtype.
    results["after"] = accelerator.gather(torch.tensor([rank])).tolist()
    results["padded"] = accelerator.pad_across_processes(torch.ones(1 + rank)).tolist()
    report(**results)
elif mode in ("next", "exit", "unchecked"):
    results = {}
    for _ in range(2 if rank == 0 else 1):
        results["gather"] = attempt(lambda: accelerator.gather(torch.ones(3)))  # SITE_GATHER
    if rank == 1 and mode == "next":
        results["next"] = attempt(lambda: accelerator.wait_for_everyone())  # SITE_NEXT
    if rank == 1 and mode == "unchecked":
        results["next"] = attempt(lambda: dist.barrier())  # a collective debug mode does not see
    report(**results)
    if mode == "exit" and rank == 1:
        sys.exit(0)  # an ordinary end of the script: exit handlers run
    os._exit(3 if any(r["type"] for r in results.values()) else 0)
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), start=1) if marker in line)


def _run(write_script, tmp_path: Path, mode: str, env: dict[str, str] | None = None):
    script = write_script(SCRIPT)
    proc = launch(script, mode, str(tmp_path), env={"ACCEL_DEBUG_MODE": "1", **(env or {})}, timeout=240, check=False)
    reports = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    return proc, reports


def test_mismatch_names_each_ranks_shape_and_dtype(write_script, tmp_path: Path) -> None:
    proc, reports = _run(write_script, tmp_path, "mismatch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(reports) == [0, 1]
    expected = {
        "gather": ("[4] torch.float32", "[4] torch.int32"),
        "reduce": ("[4] torch.float32", "[4] torch.int32"),
        "broadcast": ("[4] torch.float32", "[4] torch.int32"),
        "pad_across_processes": ("[2] torch.float32", "[3] torch.int32"),
        "gather_for_metrics": ("[4] torch.float32", "[4] torch.int32"),
        "nest": ("[[2] torch.float32, [3] torch.float32]", "[[2] torch.float32, [3] torch.int32]"),
    }
    for rank, report in reports.items():
        for op, (rank0, rank1) in expected.items():
            result = report[op]
            assert result["type"] == "CollectiveMismatchError", (rank, op, result)
            message = result["message"]
            name = "gather" if op == "gather_for_metrics" else "reduce" if op == "nest" else op
            assert f"Cannot apply `{name}` due to dtype mismatches" in message, message
            assert f"Operation: `accel.distributed.ops.{name}`" in message
            assert f"rank 0: {rank0}  (at " in message and f"rank 1: {rank1}  (at " in message, message
            assert "worker.py:" in message and "tensor.float()" in message
            assert "pad_across_processes`, or" not in message  # the shapes agree (pad: sizes may differ)
        both = report["both"]["message"]
        assert "due to shape and dtype mismatches" in both and "pad_across_processes" in both
        assert "rank 0: [2] torch.float32" in both and "rank 1: [3] torch.int32" in both
        ndim = report["ndim"]["message"]
        assert "due to shape mismatches" in ndim and "rank 0: [2] torch.float32" in ndim
        assert "rank 1: [2, 2] torch.float32" in ndim
        device = report["device"]
        assert device["type"] == "CollectiveMismatchError", device
        assert "tensors passed to `gather` were not on the cpu device while" in device["message"]
        assert "rank 0: cpu  (at " in device["message"] and "rank 1: meta  (at " in device["message"]
        for op, shape0, shape1 in (
            ("gather", "[2, 3]", "[3, 3]"),
            ("reduce", "[4]", "[5]"),
            ("broadcast", "[1, 2]", "[1, 3]"),
        ):
            shape = report[f"shape_{op}"]
            assert shape["type"] == "CollectiveMismatchError", (rank, op, shape)
            assert f"Cannot apply `{op}` due to shape mismatches" in shape["message"]
            assert f"rank 0: {shape0} torch.float32" in shape["message"]
            assert f"rank 1: {shape1} torch.float32" in shape["message"]
            assert "Pad them first with `pad_across_processes`" in shape["message"]
        assert report["after"] == [0, 1]
    assert reports[0]["padded"] == [1.0, 0.0] and reports[1]["padded"] == [1.0, 1.0]


def test_extra_call_meets_the_next_collective(write_script, tmp_path: Path) -> None:
    # Rank 0 gathers twice, rank 1 once and then waits for everyone: the second gather and the
    # barrier meet as checked collective #2 and both ranks name both call sites.
    proc, reports = _run(write_script, tmp_path, "next")
    assert sorted(reports) == [0, 1], proc.stderr[-3000:]
    gather_site, next_site = f"worker.py:{_line('SITE_GATHER')}", f"worker.py:{_line('SITE_NEXT')}"
    for rank, key in ((0, "gather"), (1, "next")):
        result = reports[rank][key]
        assert result["type"] == "CollectiveMismatchError", (rank, result)
        message = result["message"]
        assert "The processes called different collectives (checked collective #2)" in message
        assert "rank 0: `gather` at " in message and gather_site in message
        assert "rank 1: `wait_for_everyone` at " in message and next_site in message
        assert result["seconds"] < 30, result
    assert reports[1]["gather"]["type"] is None


def test_extra_call_after_a_rank_exited(write_script, tmp_path: Path) -> None:
    # Rank 1 ends the script after one gather: rank 0's second gather fails at once, naming rank 1's last call.
    proc, reports = _run(write_script, tmp_path, "exit")
    assert sorted(reports) == [0, 1], proc.stderr[-3000:]
    result = reports[0]["gather"]
    assert result["type"] == "CollectiveMismatchError", result
    message = result["message"]
    gather_site = f"worker.py:{_line('SITE_GATHER')}"
    assert "Rank 0 called `gather` (checked collective #2) at " in message and gather_site in message
    assert "rank 1: exited; its last checked collective was #1 `gather` at " in message
    assert result["seconds"] < 30, result
    assert reports[1]["gather"]["type"] is None


@pytest.mark.parametrize("timeout", [8])
def test_rank_in_an_unchecked_collective_times_out_naming_where_it_was(
    write_script, tmp_path: Path, timeout: int
) -> None:
    # Rank 1 waits in a raw barrier debug mode cannot see: rank 0 ends at the configured timeout
    # (not the 30-minute default) and says where rank 1 was last seen.
    proc, reports = _run(write_script, tmp_path, "unchecked", env={"ACCEL_TIMEOUT": str(timeout)})
    assert 0 in reports, proc.stderr[-3000:]
    result = reports[0]["gather"]
    assert result["type"] == "CollectiveTimeoutError", result
    assert f"Timed out after {timeout} s: rank 0 called `gather` (checked collective #2)" in result["message"]
    assert "rank 1: its last checked collective was #1 `gather` at " in result["message"]
    assert timeout - 0.5 <= result["seconds"] < timeout + 10
