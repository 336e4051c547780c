"""docs/accelerate_compat.md is generated from the code and current; its name list is Accelerate 1.15.0's."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

from accelerate_names import ACCELERATE_NAMES

HERE = Path(__file__).parent


def test_the_table_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "gen_compat_table.py"), "--check"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_name_list_is_accelerates(real_accelerate: Path) -> None:
    found: dict[str, list[str]] = {}
    for owner in ACCELERATE_NAMES:
        if owner in ("Accelerator", "PartialState", "AcceleratorState", "GradientState"):
            cls = getattr(
                importlib.import_module("accelerate.state" if owner != "Accelerator" else "accelerate"), owner
            )
            names = {n for n in dir(cls) if not n.startswith("_")}
            names |= set(re.findall(r"self\.([a-zA-Z][a-zA-Z0-9_]*)\s*[:=][^=]", inspect.getsource(cls)))
        else:
            module = importlib.import_module(owner)
            names = {n for n in dir(module) if not n.startswith("_")}
            if owner in ("accelerate", "accelerate.utils"):
                names = {n for n in names if not inspect.ismodule(getattr(module, n))}
            else:
                names = {n for n in names if getattr(getattr(module, n), "__module__", None) == owner}
        found[owner] = sorted(names)
    assert found == {k: list(v) for k, v in ACCELERATE_NAMES.items()}
