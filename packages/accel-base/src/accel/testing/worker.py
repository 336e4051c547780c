"""Runs conformance checks in one worker process; launched by the suite through `accel launch`.

    accel launch --num-processes 2 [--adapter NAME --emulate] -m accel.testing.worker OUT CHECK [CHECK ...]

Every rank writes `OUT/rank<r>.json`: for each check, what it returned, or the traceback
of what it raised. A failing check does not stop the others: each builds its own
Accelerator from a fresh state, and the process group (with the launcher's timeout)
is the only thing they share. A check that fails on a rank of a multi-process run before the
process group formed stops that rank: the other ranks would wait for it in the rendezvous, so it
writes what it has, prints its error and exits non-zero, and the launcher ends the others.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..distributed.state import AcceleratorState, GradientState
from . import (
    checks_claims,  # noqa: F401  (registers its check)
    checks_models,  # noqa: F401  (registers its checks)
    checks_vendor,
)
from .checks import CHECKS

ABORTED = "__aborted__"
"""Key of a rank's result that stopped before its process group formed: the check and its traceback."""


def run(out: Path, names: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    for name in names:
        base, _, arg = name.partition(":")
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        try:
            results[name] = {"ok": CHECKS[base](out, arg)}
        except Exception:
            results[name] = {"error": traceback.format_exc()}
            if several and not (dist.is_available() and dist.is_initialized()):
                rank = int(os.environ.get("RANK", "0"))
                results[ABORTED] = {"rank": rank, "check": name, "error": results[name]["error"]}
                break
    return results


def main(argv: list[str]) -> None:
    out, names = Path(argv[0]), argv[1:]
    checks_vendor.instrument_vendor()  # before the first Accelerator starts the process group
    results = run(out, names)
    rank = int(os.environ.get("RANK", "0"))
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(results))
    tmp.replace(out / f"rank{rank}.json")
    if ABORTED in results:
        aborted = results[ABORTED]
        print(
            f"accel kit: rank {rank} failed before the process group formed (check {aborted['check']!r}); "
            f"stopping the run:\n{aborted['error']}",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
