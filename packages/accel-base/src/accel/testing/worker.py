"""Runs conformance checks in one worker process; launched by the suite through `accel launch`.

    accel launch --num-processes 2 [--adapter NAME --emulate] -m accel.testing.worker OUT CHECK [CHECK ...]

Every rank writes `OUT/rank<r>.json`: for each check, what it returned, or the traceback
of what it raised. A failing check does not stop the others: each builds its own
Accelerator from a fresh state, and the process group (with the launcher's timeout)
is the only thing they share.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..distributed.state import AcceleratorState, GradientState
from . import (
    checks_models,  # noqa: F401  (registers its checks)
    checks_vendor,
)
from .checks import CHECKS


def run(out: Path, names: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        base, _, arg = name.partition(":")
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        try:
            results[name] = {"ok": CHECKS[base](out, arg)}
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    return results


def main(argv: list[str]) -> None:
    out, names = Path(argv[0]), argv[1:]
    checks_vendor.instrument_vendor()  # before the first Accelerator starts the process group
    results = run(out, names)
    rank = int(os.environ.get("RANK", "0"))
    tmp = out / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(results))
    tmp.replace(out / f"rank{rank}.json")


if __name__ == "__main__":
    main(sys.argv[1:])
