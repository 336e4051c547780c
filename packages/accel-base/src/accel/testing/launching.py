"""Run a worker script on several processes through `accel launch`, for tests.

Adapter packages use it through the pytest plugin (`accel.testing.pytest_plugin`, loaded
automatically where accel-base is installed): the `launch` fixture runs a script with the
launch flags a test package sets once in its conftest (`accel_launch_args`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

TEARDOWN_ABORT = "terminate called without an active exception"
"""What a gloo worker prints when torch aborts it during interpreter finalization, after its
script has finished: gloo's worker thread frees a collective's tensors, needs the GIL while
CPython finalizes, and is ended through a noexcept destructor. `PartialState`'s exit hook now
drains that work before finalization (a script ending in `gather`: 5 aborts in 14 launches
before, 0 after; `tests/test_exit_teardown.py`); the relaunch stays as a fallback for the
launches seen before it (under torch 2.9, and after `join_uneven_inputs`), not re-measured."""


def run_launch(
    script: str | Path,
    *args: str,
    nproc: int = 2,
    launch_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    keep_accel_env: bool = False,
    retry_teardown_abort: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `script *args` through `accel launch --num-processes nproc *launch_args` and return the finished process.

    The workers get this environment without its `ACCEL_*` variables (a test's options come
    only from what it passes; `keep_accel_env` keeps them), unbuffered output, one thread each,
    and `env` on top. With
    `check`, a non-zero exit fails the calling test and shows the workers' output.
    `retry_teardown_abort` launches once more when, and only when, a worker died with torch's
    teardown abort (`TEARDOWN_ABORT`); any other failure fails at once.
    """
    import pytest

    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc), *launch_args, str(script), *args]
    clean = {k: v for k, v in os.environ.items() if keep_accel_env or not k.startswith("ACCEL_")}
    full_env = {**clean, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if retry_teardown_abort and proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr:
        warnings.warn(
            f"a worker aborted at interpreter exit (torch's gloo teardown); relaunching {script}", stacklevel=2
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(
            f"launch failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-8000:]}"
        )
    return proc
