"""Helpers for the compatibility tests: they run scripts under the real Accelerate and under accel.

These tests need `accelerate==1.15.0` installed next to accel (the `compat` nox session).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def torchrun(
    *args: str, accel: bool, nproc: int = 2, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `args` (a script and its arguments) on `nproc` local processes through torchrun.

    `accel=True`: through `accel.as_accelerate`, so `import accelerate` is accel. Otherwise
    under the real Accelerate, which needs ACCELERATE_USE_CPU=1 to run distributed on CPUs.
    """
    runner = ["-m", "accel.as_accelerate"] if accel else []
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *runner, *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "ACCELERATE_USE_CPU": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)


def check(proc: subprocess.CompletedProcess[str]) -> None:
    if proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}")


GLOO_EXIT_ABORT = "terminate called without an active exception"


def check_reference(proc: subprocess.CompletedProcess[str], result: Path) -> None:
    """`check` for a run under the real Accelerate, which does not drain gloo's work at exit.

    Accelerate 1.15.0 leaves the gloo group to interpreter teardown, where a worker thread
    that frees a finished collective's tensors can abort the process (SIGABRT, "terminate
    called without an active exception"; accel's own exit hook drains this, see
    `PartialState._destroy_at_exit`). CI saw it once in ~30 reference runs. That abort comes
    after the script's last line, so a run that wrote its complete `result` file and died only
    of it still gives the reference numbers; any other failure fails the test.
    """
    if proc.returncode == 0:
        return
    aborted_at_exit = GLOO_EXIT_ABORT in proc.stderr and "SIGABRT" in proc.stderr
    if aborted_at_exit and result.is_file():
        try:
            import torch

            torch.load(result)
        except Exception:  # a truncated or unreadable file is a failed run
            pass
        else:
            return
    check(proc)


@pytest.fixture(scope="session")
def real_accelerate() -> Path:
    """The installed Accelerate's package directory (the comparison needs version 1.15.0)."""
    accelerate = pytest.importorskip("accelerate")
    if accelerate.__version__ != "1.15.0":
        pytest.fail(f"these tests compare with accelerate 1.15.0; {accelerate.__version__} is installed")
    return Path(accelerate.__file__).parent
