"""The asynchronous part of `save_state(async_save=True)`: one save at a time, on a background thread.

The writing rank hands over a save whose states are already copied to host memory; a thread
writes, hashes and commits it. The next save or load waits for it first, and so does the
process at exit (the thread is not a daemon). A failure is kept, with the checkpoint it was
for, and raised at the next `save_state` or `load_state` on every rank, or written to stderr
at exit if none comes. A process killed meanwhile leaves the previous checkpoint intact: the
new one lives in its staging directory until it is complete.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..errors import CheckpointError

_lock = threading.Lock()
_running: tuple[threading.Thread, str] | None = None
_failure: CheckpointError | None = None


def start(what: str, work: Callable[[], Any]) -> None:
    """Run `work` (the rest of the save `what`) on a background thread. The caller has finished any earlier one."""
    global _running

    def run() -> None:
        global _failure
        try:
            work()
        except BaseException as exc:
            error = exc if isinstance(exc, CheckpointError) else CheckpointError(f"{type(exc).__name__}: {exc}")
            _failure = CheckpointError(
                f"The asynchronous {what} failed: {error}. That checkpoint was not written; the previous one is "
                "intact. Save again."
            )
            _failure.__cause__ = exc

    thread = threading.Thread(target=run, name="accel-async-save", daemon=False)
    with _lock:
        _running = (thread, what)
    thread.start()


def finish() -> CheckpointError | None:
    """Wait for the background save, if one runs; returns (and forgets) its failure, if it failed."""
    global _running, _failure
    with _lock:
        running, _running = _running, None
    if running is not None:
        running[0].join()
    failure, _failure = _failure, None
    return failure


def wait() -> None:
    """Wait for the background save, if one runs, keeping its failure for `finish` to report."""
    running = _running
    if running is not None:
        running[0].join()


@atexit.register
def _at_exit() -> None:
    failure = finish()
    if failure is not None:
        print(f"accel: {failure}", file=sys.stderr, flush=True)
