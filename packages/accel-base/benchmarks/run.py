"""`nox -s bench`: accel against raw PyTorch, as ratios measured in the same process.

1. Step time: raw DDP (PyTorch defaults), raw DDP with the settings accel uses, and accel,
   interleaved in one 2-process gloo group, for MLPs of hidden size 64, 512 and 2048.
2. Import cost: `python -X importtime -c "import accel"` against `import torch`.

Prints a markdown table; the figures go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def import_cost(module: str) -> float:
    """Cumulative import time of `module` in microseconds, from -X importtime."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True, check=True
    )
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s*(\S+)$", line)
        if m and m.group(2) == module:
            return float(m.group(1))
    raise RuntimeError(f"no import time line for {module}")


def step_times(extra: list[str]) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        cmd = [
            sys.executable,
            "-m",
            "accel.cli",
            "launch",
            "--num-processes",
            "2",
            str(HERE / "step_bench.py"),
            "--out",
            str(out),
            *extra,
        ]
        subprocess.run(cmd, check=True, timeout=1800)
        return json.loads(out.read_text())


def main() -> None:
    extra = sys.argv[1:]
    steps = step_times(extra)
    print("\n## Step time, 2 gloo processes (median ms per step)\n")
    print(
        "| hidden | raw DDP (defaults) | raw DDP (same settings) | accel | accel / raw defaults | accel / raw same settings |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for hidden, m in steps.items():
        naive, same, ours = m["raw_ddp_default"], m["raw_ddp_same_settings"], m["accel"]
        print(
            f"| {hidden} | {naive * 1e3:.3f} | {same * 1e3:.3f} | {ours * 1e3:.3f} | {ours / naive:.3f} | {ours / same:.3f} |"
        )

    torch_us = import_cost("torch")
    accel_us = import_cost("accel")
    print("\n## Import cost (cumulative, -X importtime)\n")
    print("| import torch | import accel (includes torch) | accel's own share |")
    print("| --- | --- | --- |")
    print(
        f"| {torch_us / 1e3:.0f} ms | {accel_us / 1e3:.0f} ms | {(accel_us - torch_us) / 1e3:.0f} ms ({accel_us / torch_us:.2f}x) |"
    )


if __name__ == "__main__":
    main()
