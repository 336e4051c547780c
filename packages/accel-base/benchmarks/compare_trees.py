"""Step overhead of two accel source trees, interleaved: `accel / raw DDP (same settings)` before and after.

For changes that touch the step path (the architecture issue asked for the ratio "before and
after in one run"). Each repetition runs `step_bench.py` once per tree through
`accel launch --cpu --num-processes 2`, with `PYTHONPATH` pointing at that tree's
`packages/accel-base/src`; the order of the trees alternates between repetitions so that drift in
machine load hits both alike. Per run it records the median of the paired per-round ratios and the
Python calls per step (a figure load does not move); at the end it prints, per tree and size, the
median over runs and every run's value.

    git worktree add --detach /tmp/before <commit>
    python packages/accel-base/benchmarks/compare_trees.py \\
        --tree before=/tmp/before/packages/accel-base/src --tree after=packages/accel-base/src \\
        --repeats 4 --sizes 64 --rounds 40 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_once(src: str, sizes: str, rounds: int, steps: int) -> dict[str, tuple[float, float, float]]:
    """{size: (median paired ratio accel/raw same settings, accel calls per step, raw calls per step)}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "accel.cli", "launch", "--cpu", "--num-processes", "2"]
        cmd += [str(HERE / "step_bench.py"), "--out", str(out), "--sizes", sizes]
        cmd += ["--rounds", str(rounds), "--steps", str(steps)]
        proc = subprocess.run(cmd, env=env, timeout=3600, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # An older tree may die of gloo's teardown abort after writing its results (accel drains it at exit
        # since then): the figures are complete, so only a missing result file is a failed run.
        if not out.is_file():
            raise RuntimeError(
                f"step_bench.py on {src} wrote no results (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        data = json.loads(out.read_text())
    return {
        size: (
            statistics.median(row["paired_round_ratios"]["accel/raw_ddp_same_settings"]),
            row["python_calls_per_step"]["accel"],
            row["python_calls_per_step"]["raw_ddp_same_settings"],
        )
        for size, row in data.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH to a packages/accel-base/src")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="64,512,2048")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    runs: dict[str, list[dict[str, tuple[float, float, float]]]] = {name: [] for name in trees}
    for rep in range(args.repeats):
        order = list(trees.items())
        for name, src in order if rep % 2 == 0 else order[::-1]:
            row = run_once(src, args.sizes, args.rounds, args.steps)
            runs[name].append(row)
            print(rep, name, {s: round(v[0], 3) for s, v in row.items()}, flush=True)
    for name, rows in runs.items():
        for size in rows[0]:
            ratios = [r[size][0] for r in rows]
            print(
                f"{name} hidden {size}: accel/raw same settings median {statistics.median(ratios):.3f} "
                f"(runs {', '.join(f'{x:.3f}' for x in ratios)}); Python calls per step "
                f"{rows[0][size][1]} vs raw {rows[0][size][2]}"
            )


if __name__ == "__main__":
    main()
