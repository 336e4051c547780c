"""Start-to-exit time of a 2-process no-op: `accel launch` against torchrun, interleaved.

Each round runs both launchers once on the same no-op script (`pass`), the order alternating
between rounds so neither always pays for the other's dirty caches; the first `--warmup`
rounds are dropped. Reported: each launcher's median wall time, the median of the per-round
ratios accel / torchrun and their spread, the same for the CPU time of every process of the
launch (user + system), the machine's load average before and after, and what `accel launch`
itself spends before torchrun's `main` runs (torch imported first, so the import of torch,
which both pay and whose time varies by hundreds of milliseconds between runs, is left out).

    python launch_bench.py [--rounds 20] [--warmup 2] [--nproc 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def commands(script: Path, nproc: int) -> dict[str, list[str]]:
    """The two launches being compared, each with its default flags."""
    return {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"],
        "accel launch": [sys.executable, "-m", "accel.cli", "launch", f"--num-processes={nproc}"],
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, every process of the launch) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# In a fresh interpreter with torch's launcher already imported: the time `accel launch` takes before it hands
# over to torchrun's `main` (importing accel's command line, parsing, resolving, the worker environment).
OWN_COST = """
import os, sys, time
import torch.distributed.run as run
def handed_over(argv):
    print(1e3 * (time.perf_counter() - start), 1e3 * (time.process_time() - cpu_start))
    raise SystemExit(0)
run.main = handed_over
start, cpu_start = time.perf_counter(), time.process_time()
from accel.cli import main
main(["launch", "--num-processes={nproc}", {script!r}])
"""


def own_cost(script: Path, nproc: int, rounds: int, env: dict[str, str]) -> dict[str, float]:
    """Median wall and CPU milliseconds `accel launch` spends before torchrun's `main` runs (torch imported first)."""
    wall, cpu = [], []
    for _ in range(rounds):
        code = OWN_COST.format(nproc=nproc, script=str(script))
        out = subprocess.run([sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True)
        ms = out.stdout.split()
        wall.append(float(ms[0]))
        cpu.append(float(ms[1]))
    return {"wall_ms": round(statistics.median(wall), 1), "cpu_ms": round(statistics.median(cpu), 1)}


def measure(rounds: int, warmup: int, nproc: int) -> dict[str, object]:
    """Interleaved rounds; the figures of the rounds after the warm-up."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # Both launchers run from compiled bytecode, as installed packages do (pip compiles them at install). With
    # PYTHONDONTWRITEBYTECODE an editable checkout would recompile accel's modules on every launch (about 20 ms
    # here) while torch's come precompiled; the warm-up rounds write accel's .pyc files.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "noop.py"
        script.write_text("pass\n")
        cmds = commands(script, nproc)
        names = list(cmds)
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for r in range(warmup + rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                wall, cpu_seconds = timed([*cmds[name], str(script)], env)
                if r >= warmup:
                    times[name].append(wall)
                    cpu[name].append(cpu_seconds)
        before_torchrun = own_cost(script, nproc, max(5, rounds // 2), env)
        # accel's only code on the path: what it adds before torchrun's main, over torchrun's whole launch.
        before_torchrun["share_of_torchrun_median"] = round(
            before_torchrun["wall_ms"] / 1e3 / statistics.median(times["torchrun"]), 4
        )
    return {
        "nproc": nproc,
        "rounds": rounds,
        "warmup_rounds_dropped": warmup,
        "median_seconds": {name: round(statistics.median(v), 4) for name, v in times.items()},
        "median_cpu_seconds": {name: round(statistics.median(v), 4) for name, v in cpu.items()},
        "accel_launch_before_torchrun": before_torchrun,
        **_paired("ratio_accel_over_torchrun", times),
        **_paired("cpu_ratio_accel_over_torchrun", cpu),
        "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "seconds": {name: [round(x, 4) for x in v] for name, v in times.items()},
        "cpu_seconds": {name: [round(x, 4) for x in v] for name, v in cpu.items()},
    }


def _paired(key: str, figures: dict[str, list[float]]) -> dict[str, object]:
    """The median of the per-round ratios accel / torchrun under `key`, their interquartile range, and a 95%
    bootstrap interval of that median (2000 resamples of the rounds, fixed seed: the same data gives the same
    interval)."""
    ratios = sorted(a / b for a, b in zip(figures["accel launch"], figures["torchrun"]))
    quartile = max(1, len(ratios) // 4)
    draw = random.Random(0)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {
        key: round(statistics.median(ratios), 4),
        key.replace("ratio", "interquartile"): [round(ratios[quartile - 1], 4), round(ratios[-quartile], 4)],
        key.replace("ratio", "median_95ci"): [round(medians[49], 4), round(medians[1949], 4)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    result = measure(args.rounds, args.warmup, args.nproc)
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
