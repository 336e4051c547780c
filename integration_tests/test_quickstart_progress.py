"""The quickstart's progress reaches a pipe as it happens: every line is flushed when printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).parents[1] / "examples" / "quickstart.py"


def test_progress_lines_are_flushed_when_piped() -> None:
    # os._exit skips the flush at exit: only what the script flushed itself reaches the pipe.
    code = (
        "import os, runpy, sys; sys.argv = ['quickstart.py']; "
        f"runpy.run_path({str(QUICKSTART)!r}, run_name='__main__'); os._exit(0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "ACCEL_ADAPTER": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(r"epoch (\d) step (\d+)/(\d+): loss [0-9.]+", proc.stdout)
    assert len(steps) == 5 * int(steps[0][2]), proc.stdout[-2000:]  # one line per step, none left in a buffer
    assert len(re.findall(r"^epoch \d: train loss", proc.stdout, re.M)) == 5
    assert "eval: 100 samples" in proc.stdout
