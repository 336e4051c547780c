"""Debug mode (`ACCEL_DEBUG_MODE=1`, `accel launch --debug`): each collective is checked across ranks first.

A checked collective gets a sequence number per process group. Before it runs, each rank
1. counts itself in at that number in the process group's store and waits, polling, until
   every rank of the group has (a rank that exited is seen there at once);
2. exchanges what it is about to do: the operation, the user's call site, and each
   tensor's shape, dtype and device type;
3. raises `CollectiveMismatchError` on every rank if these differ.

Waiting in the store rather than in the collective is what turns a different number of
collective calls on some ranks into an error instead of a hang: a rank that went on to
another checked collective meets this one under the same number and the exchange names
both call sites; a rank that exited left a note naming its last call. A rank stuck in an
unchecked collective (a model's own gradient all-reduce) still ends at the process group's
timeout, with a message saying where each rank was last seen. None of this runs outside
debug mode.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist

from ..errors import CollectiveMismatchError, CollectiveTimeoutError

_PREFIX = "accel_debug"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # accel/
_SKIPPED_FILES = (os.path.join("", "contextlib.py"), os.path.join("", "functools.py"))
_tracker: _Tracker | None = None
_INTERNAL_FILES: dict[str, bool] = {}  # a code object's file name -> whether it is accel's (or contextlib's)


def call_site() -> str:
    """`file:line` of the user's code that led here: the first frame outside accel (and contextlib)."""
    return format_site(*user_position(sys._getframe(1)))


def user_position(frame: Any) -> tuple[Any, int]:
    """(code object, instruction offset) of the first frame from `frame` outwards that is not accel's (nor
    contextlib's, functools'), for `format_site`. Cheap enough for every collective (`accel.distributed.watchdog`):
    one dict lookup per frame once a file has been seen, and the line is worked out only when it is shown."""
    while frame is not None:
        code = frame.f_code
        internal = _INTERNAL_FILES.get(code.co_filename)
        if internal is None:
            absolute = os.path.abspath(code.co_filename)
            internal = absolute.startswith(_PACKAGE_DIR + os.sep) or absolute.endswith(_SKIPPED_FILES)
            _INTERNAL_FILES[code.co_filename] = internal
        if not internal:
            return code, frame.f_lasti
        frame = frame.f_back
    return None, -1


def format_site(code: Any, offset: int) -> str:
    """`file:line` of the instruction at `offset` in `code`, the file relative to the working directory when
    it lies below it."""
    if code is None:
        return "<unknown>"
    line = next((n for start, end, n in code.co_lines() if start <= offset < end and n is not None), 0)
    filename = os.path.abspath(code.co_filename)
    try:
        shown = os.path.relpath(filename)
    except ValueError:  # another drive (Windows)
        shown = filename
    return f"{filename if shown.startswith('..') else shown}:{line}"


def check_collective(
    name: str,
    tensors: list[torch.Tensor],
    group: Any = None,
    *,
    timeout_s: float,
    device_type: str,
    pad: bool = False,
    count: int | None = None,
) -> None:
    """Check that every rank of `group` is at the same collective with matching tensors, else raise.

    `pad`: only the number of dimensions must match, not the sizes (`pad_across_processes`).
    `timeout_s`, `device_type`: the process group's timeout and this process's device type (the caller
    reads them from its state; this module reads no global state).
    `count`: the number of objects for object collectives, which must match.

    Raises:
        CollectiveMismatchError: on every rank, when the ranks called different collectives,
            passed tensors of different shapes, dtypes or device types, or a rank of the
            group has exited.
        CollectiveTimeoutError: a rank did not reach this collective within the process group's timeout.
    """
    tracker = _get_tracker()
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    key = "world" if group is None else "g" + "-".join(map(str, ranks))
    call = {
        "rank": dist.get_rank(),
        "op": name,
        "site": call_site(),
        "tensors": [[list(t.shape), str(t.dtype), t.device.type] for t in tensors],
        "count": count,
    }
    if tracker is not None:
        call["seq"] = tracker.arrive(key, ranks, call, timeout_s)
    everyone: list[Any] = [None] * len(ranks)
    dist.all_gather_object(everyone, call, group=group)
    problem = _compare(everyone, pad, device_type)
    if problem:
        raise CollectiveMismatchError(problem)


def _compare(calls: list[dict[str, Any]], pad: bool, device_type: str) -> str | None:
    first = calls[0]
    seq = f" (checked collective #{first['seq']})" if "seq" in first else ""
    if any(c["op"] != first["op"] for c in calls):
        lines = "\n".join(f"  - rank {c['rank']}: `{c['op']}` at {c['site']}" for c in calls)
        return (
            f"The processes called different collectives{seq}:\n{lines}\n"
            "Every process must make the same collective calls in the same order. Look for a loop or a branch "
            "that runs a different number of times on some ranks (uneven data: keep `even_batches=True`)."
        )
    op = first["op"]
    if any(c["count"] != first["count"] for c in calls):
        lines = "\n".join(f"  - rank {c['rank']}: {c['count']} objects at {c['site']}" for c in calls)
        return f"Cannot apply `{op}`: the processes passed lists of different lengths{seq}.\n{lines}"
    if any(t[2] != device_type for c in calls for t in c["tensors"]):
        lines = "\n".join(
            f"  - rank {c['rank']}: {', '.join(sorted({t[2] for t in c['tensors']}))}  (at {c['site']})" for c in calls
        )
        return (
            f"One or more of the tensors passed to `{op}` were not on the {device_type} device while the "
            f"`Accelerator` is configured for {device_type}{seq}:\n{lines}\n"
            f"Move them to the {device_type} device before calling `{op}`."
        )
    shapes_differ = any(not _same_shapes(c["tensors"], first["tensors"], pad) for c in calls)
    dtypes_differ = any([t[1] for t in c["tensors"]] != [t[1] for t in first["tensors"]] for c in calls)
    if not (shapes_differ or dtypes_differ):
        return None
    what = " and ".join(w for w, bad in (("shape", shapes_differ), ("dtype", dtypes_differ)) if bad)
    lines = "\n".join(f"  - rank {c['rank']}: {_describe(c['tensors'])}  (at {c['site']})" for c in calls)
    hints = []
    if shapes_differ:
        hints.append("Pad them first with `pad_across_processes`, or make every rank pass the same shapes.")
    if dtypes_differ:
        hints.append(
            "Cast them to one dtype first (for example `tensor.float()`): the backend would combine the raw "
            "values of different dtypes and return wrong numbers."
        )
    return (
        f"Cannot apply `{op}` due to {what} mismatches: the tensors do not have the same {what} on every "
        f"process{seq}.\nOperation: `accel.distributed.ops.{op}`\nInput shapes and dtypes:\n{lines}\n" + " ".join(hints)
    )


def _same_shapes(mine: list[list[Any]], ref: list[list[Any]], pad: bool) -> bool:
    # Padding needs only the same number of dimensions (a rank whose tensor lacks `dim` would skip
    # the size exchange the others wait in); the sizes themselves are what it evens out.
    if len(mine) != len(ref):
        return False
    if not pad:
        return all(a == b for (a, _, _), (b, _, _) in zip(mine, ref))
    return all(len(a) == len(b) for (a, _, _), (b, _, _) in zip(mine, ref))


def _describe(tensors: list[list[Any]]) -> str:
    # A single tensor reads as its shape and dtype; a nest as the list of its tensors'.
    parts = [f"{shape} {dtype}" for shape, dtype, _ in tensors]
    return parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"


class _Tracker:
    """This process's sequence numbers, kept in the default process group's store."""

    def __init__(self, store: Any, rank: int) -> None:
        self.store = store
        self.rank = rank
        self.seq: Counter[str] = Counter()
        self.last: dict[str, Any] | None = None
        atexit.register(self._note_exit)

    def arrive(self, key: str, ranks: list[int], call: dict[str, Any], timeout: float) -> int:
        """Count this rank in at the group's next number and wait for the others; returns the number."""
        self.seq[key] += 1
        seq = call["seq"] = self.seq[key]
        self.last = {k: call[k] for k in ("op", "site", "seq")}
        peers = [r for r in ranks if r != self.rank]
        # One counter per group: call #n is complete when the count reaches n x group size.
        counter, target = f"{_PREFIX}/{key}/arrived", seq * len(ranks)
        gone: dict[int, Any] = {}
        try:
            self.store.set(f"{_PREFIX}/at/{self.rank}", json.dumps(self.last))
            arrived = self.store.add(counter, 1)
            deadline, pause = time.monotonic() + timeout, 0.0005
            while arrived < target and not gone and time.monotonic() < deadline:
                if self.store.add(f"{_PREFIX}/exited", 0):
                    gone = {r: p for r in peers if (p := self._position(r, "exit")) is not None}
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                arrived = self.store.add(counter, 0)
            behind = {r: self._position(r, "at") for r in peers} if arrived < target and not gone else {}
        except RuntimeError as exc:  # the store's host (rank 0 outside torchrun) has gone
            raise RuntimeError(
                f"Debug mode lost the process group's store while rank {self.rank} waited in `{call['op']}` "
                f"(checked collective #{seq}) at {call['site']}; the process hosting it has probably exited: {exc}"
            ) from exc
        if arrived >= target:
            return seq
        where = f"rank {self.rank} called `{call['op']}` (checked collective #{seq}) at {call['site']}"
        if gone:
            lines = "\n".join(f"  - rank {r}: exited; {_last_call(p)}" for r, p in sorted(gone.items()))
            raise CollectiveMismatchError(
                f"{where[0].upper()}{where[1:]}, but other processes have exited and will never call it:\n{lines}\n"
                "Every process must make the same collective calls; look for a loop or a branch that runs a "
                "different number of times on some ranks."
            )
        lines = "\n".join(
            f"  - rank {r}: {_last_call(p)}" for r, p in sorted(behind.items()) if not p or p["seq"] < seq
        )
        raise CollectiveTimeoutError(
            f"Timed out after {timeout:g} s: {where} and waited for processes that never reached it:\n{lines}\n"
            "They are still computing, stuck in a collective debug mode does not check, or dead."
        )

    def _position(self, rank: int, kind: str) -> dict[str, Any] | None:
        name = f"{_PREFIX}/{kind}/{rank}"
        return json.loads(self.store.get(name)) if self.store.check([name]) else None

    def _note_exit(self) -> None:
        # Lets the other ranks fail at once instead of waiting out the timeout for a rank that is gone.
        try:
            self.store.set(f"{_PREFIX}/exit/{self.rank}", json.dumps(self.last or {}))
            self.store.add(f"{_PREFIX}/exited", 1)
        except Exception:  # the store went first (its host exited): nobody is left to tell
            pass


def _last_call(position: dict[str, Any] | None) -> str:
    if not position:
        return "it made no checked collective call"
    return f"its last checked collective was #{position['seq']} `{position['op']}` at {position['site']}"


def _get_tracker() -> _Tracker | None:
    """The tracker of the current default process group; None where its store cannot be reached."""
    global _tracker
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
    if _tracker is None or _tracker.store is not store:
        _tracker = _Tracker(store, dist.get_rank())
    return _tracker
