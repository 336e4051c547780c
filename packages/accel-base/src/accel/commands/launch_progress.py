"""`accel launch`'s progress line while its workers start.

Starting workers takes a while (an interpreter and torch per process, then the process group): the
start line is printed at once, and when the workers are not all up after `FIRST_SECONDS`, one line
every `EVERY_SECONDS` says how far they got, then one when all are up. The launcher gives the workers a
folder (`PROGRESS_DIR_ENV`); each worker's bootstrap writes `started-<local rank>` as it runs the script,
and accel writes `ready-<local rank>` once the process has joined its process group
(`accel.settings.launch.mark_ready`).
A script that never starts accel's state is followed until `SCRIPT_ONLY_SECONDS` after its last start.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..settings.launch import PROGRESS_DIR_ENV

FIRST_SECONDS = 5.0
EVERY_SECONDS = 10.0
SCRIPT_ONLY_SECONDS = 30.0
POLL_SECONDS = 0.25


class StartupProgress:
    """Follows `nproc` local workers from the start line until all are up (a daemon thread).

    `env()`: what the workers must inherit. `stop()` ends the thread and removes the folder.
    """

    def __init__(self, nproc: int, script: str) -> None:
        self.nproc = nproc
        self.script = os.path.basename(script)
        self.folder = Path(tempfile.mkdtemp(prefix="accel-launch-"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="accel-launch-progress", daemon=True)

    def env(self) -> dict[str, str]:
        return {PROGRESS_DIR_ENV: str(self.folder)}

    def start(self) -> StartupProgress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _count(self, kind: str) -> int:
        try:
            return sum(1 for p in self.folder.iterdir() if p.name.startswith(f"{kind}-"))
        except OSError:
            return 0

    def _follow(self) -> None:
        began = time.monotonic()
        next_line, printed, all_started_at = FIRST_SECONDS, False, None
        while not self._stop.wait(POLL_SECONDS):
            started, ready = self._count("started"), self._count("ready")
            elapsed = time.monotonic() - began
            if ready >= self.nproc:
                if printed:
                    _say(f"all {self.nproc} processes are up after {elapsed:.0f} s")
                return
            if started >= self.nproc:
                all_started_at = elapsed if all_started_at is None else all_started_at
                if elapsed - all_started_at >= SCRIPT_ONLY_SECONDS:
                    return  # the script runs without accel's state: nothing more to follow
            if elapsed >= next_line:
                _say(
                    f"still starting after {elapsed:.0f} s: {started} of {self.nproc} processes running "
                    f"{self.script}, {ready} joined the process group"
                )
                printed, next_line = True, next_line + EVERY_SECONDS


def _say(line: str) -> None:
    print(f"accel launch: {line}", file=sys.stderr, flush=True)
