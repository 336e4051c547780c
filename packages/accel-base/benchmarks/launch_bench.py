"""Start-to-exit cost of a 2-process no-op: `accel launch` against torchrun, paired rounds, order rotated.

Two designs, both running the full launch of the same no-op script (`pass`) through each launcher:

1. Fresh launches: each round runs `torchrun --standalone --nproc-per-node=2` and
   `accel launch --num-processes=2` (the console scripts) once, the order alternating between
   rounds; the first `--warmup` rounds are dropped. Reported: each launcher's median wall and CPU time (user + system of every
   process of the launch), the median of the per-round ratios accel / torchrun with their
   interquartile range and a 95% bootstrap interval. On a small shared machine a launch's CPU time
   varies by +-10% from one run to the next (importing torch, which both launchers do), so this
   interval is several percent wide: it cannot resolve 2%.
2. Forked launches: one interpreter imports torch's launcher (`torch.distributed.run`, the part
   both launchers share and the noisy one), then for each launch forks a child that does what
   the launcher's console script does on the same command line: import the rest, parse,
   rendezvous, start and wait for the two workers, interpreter exit. The child's wall time and the CPU time of it and
   every process it waited for (workers, `setpriv`, shells) are taken per launch; the rounds are
   paired and the order alternates. The objects both share are frozen (`gc.freeze`, as forking
   servers do), so the children's collections and exit walk only what each launcher made itself. The median of the paired differences accel - torchrun (with a
   95% bootstrap interval) is what `accel launch` adds to a launch, measured to a few milliseconds.
   `full_launch_ratio_from_difference` divides torchrun's median fresh launch plus that difference
   by torchrun's median fresh launch (the interval resamples both designs' rounds).

Also: what `accel launch` itself spends before torchrun's `main` runs (torch imported first),
and the machine's load average before and after.

    python launch_bench.py [--rounds 16] [--forked-rounds 80] [--warmup 2] [--nproc 2] [--out FILE]
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
    """The two launches being compared, each with its default flags, through the commands users type (the
    console scripts `torchrun` and `accel` beside this interpreter; `python -m` where one is missing)."""
    bindir = Path(sys.executable).parent

    def command(name: str, module: str) -> list[str]:
        return [str(bindir / name)] if (bindir / name).is_file() else [sys.executable, "-m", module]

    return {
        "torchrun": [*command("torchrun", "torch.distributed.run"), "--standalone", f"--nproc-per-node={nproc}"],
        "accel launch": [*command("accel", "accel.cli"), "launch", f"--num-processes={nproc}"],
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


# Run as a script file (every frame has a source file, as under the console scripts): imports what both launchers
# import first (torch's launcher), then for each line on stdin ("torchrun" or "accel launch") forks a child that
# does what that launcher's console script does (`from X import main; sys.exit(main())`) with the line's command
# line and exits as an interpreter does (atexit handlers, finalization); the parent waits and prints one JSON
# line: the child's wall seconds and the CPU seconds of the child and of every process it waited for. The loop is
# at the top level, so a child's SystemExit ends the child there and runs nothing else.
FORK_SERVER = """
import gc, importlib, json, os, sys, time
import torch.distributed.run
gc.freeze()  # the shared objects stay out of both children's collections (and pages); each launcher's own are collected
ENTRY = json.loads(sys.argv[1])
null = os.open(os.devnull, os.O_WRONLY)
for line in sys.stdin:
    name = line.strip()
    module, argv = ENTRY[name]
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.argv = [name, *argv]
        sys.exit(importlib.import_module(module).main())
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    cpu = usage.ru_utime + usage.ru_stime
    print(json.dumps({"name": name, "wall": wall, "cpu": cpu, "status": status}), flush=True)
"""


def forked(script: Path, nproc: int, rounds: int, warmup: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Wall and CPU seconds of `rounds` paired forked launches per launcher (order alternating), warm-up dropped."""
    entry = {
        "torchrun": ["torch.distributed.run", ["--standalone", f"--nproc-per-node={nproc}", str(script)]],
        "accel launch": ["accel.cli", ["launch", f"--num-processes={nproc}", str(script)]],
    }
    names = list(entry)
    out: dict[str, list[float]] = {f"{kind}:{name}": [] for kind in ("wall", "cpu") for name in names}
    server_file = script.with_name("fork_server.py")
    server_file.write_text(FORK_SERVER)
    server = subprocess.Popen(
        [sys.executable, str(server_file), json.dumps(entry)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for r in range(warmup + rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                server.stdin.write(name + "\n")
                server.stdin.flush()
                got = json.loads(server.stdout.readline())
                if got["status"] != 0:
                    raise RuntimeError(f"the forked {name} launch failed (wait status {got['status']})")
                if r >= warmup:
                    out[f"wall:{name}"].append(got["wall"])
                    out[f"cpu:{name}"].append(got["cpu"])
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    return out


def _difference(accel: list[float], torchrun: list[float], full_torchrun: list[float]) -> dict[str, object]:
    """Median of the paired differences accel - torchrun (ms) with a 95% bootstrap interval, and what it makes of
    torchrun's median fresh launch: (median + difference) / median, its interval resampling both designs' rounds
    (2000 resamples, fixed seed)."""
    diffs = [a - t for a, t in zip(accel, torchrun)]
    draw = random.Random(1)
    d_boot, ratio_boot = [], []
    for _ in range(2000):
        d = statistics.median(draw.choices(diffs, k=len(diffs)))
        base = statistics.median(draw.choices(full_torchrun, k=len(full_torchrun)))
        d_boot.append(d)
        ratio_boot.append((base + d) / base)
    d_boot.sort()
    ratio_boot.sort()
    d, base = statistics.median(diffs), statistics.median(full_torchrun)
    return {
        "difference_ms": round(1e3 * d, 1),
        "difference_ms_95ci": [round(1e3 * d_boot[49], 1), round(1e3 * d_boot[1949], 1)],
        "full_launch_ratio_from_difference": round((base + d) / base, 4),
        "full_launch_ratio_from_difference_95ci": [round(ratio_boot[49], 4), round(ratio_boot[1949], 4)],
    }


def measure(rounds: int, forked_rounds: int, warmup: int, nproc: int) -> dict[str, object]:
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
        fork = forked(script, nproc, forked_rounds, warmup, env)
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
        "forked": {
            "rounds": forked_rounds,
            "median_seconds": {name: round(statistics.median(fork[f"wall:{name}"]), 4) for name in names},
            "median_cpu_seconds": {name: round(statistics.median(fork[f"cpu:{name}"]), 4) for name in names},
            "wall": _difference(fork["wall:accel launch"], fork["wall:torchrun"], times["torchrun"]),
            "cpu": _difference(fork["cpu:accel launch"], fork["cpu:torchrun"], cpu["torchrun"]),
            "seconds": {name: [round(x, 4) for x in fork[f"wall:{name}"]] for name in names},
            "cpu_seconds": {name: [round(x, 4) for x in fork[f"cpu:{name}"]] for name in names},
        },
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
    parser.add_argument("--rounds", type=int, default=16, help="paired rounds of fresh launches")
    parser.add_argument("--forked-rounds", type=int, default=80, help="paired rounds of forked launches")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    result = measure(args.rounds, args.forked_rounds, args.warmup, args.nproc)
    brief = {k: v for k, v in result.items() if k not in ("seconds", "cpu_seconds")}
    brief["forked"] = {k: v for k, v in result["forked"].items() if k not in ("seconds", "cpu_seconds")}
    print(json.dumps(brief, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
