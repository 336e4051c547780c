"""`nox -s bench`: accel against raw PyTorch, as ratios measured in the same process.

1. Step time: raw DDP (PyTorch defaults), raw DDP with the settings accel uses, and accel,
   interleaved in one 2-process gloo group, for MLPs of hidden size 64, 512 and 2048.
2. Import cost: `python -X importtime -c "from accel import Accelerator"` against `import torch`.
3. Checkpoints: `save_state`/`load_state` against the same files written and read without
   accel (safetensors for the model, torch.save/torch.load for the optimizer), verified against
   unverified loads, at 100 MB and 1 GB, in one process (with the stall of an asynchronous against
   a synchronous save) and in 2 gloo processes (DDP, rank 0 writes, both load); wall and CPU time
   (`--checkpoint-args "--rounds 5 --sizes 100"` passes options to io_bench).
4. Data loading: a prepared loader (sharded, and dispatched) against a plain DataLoader
   with DistributedSampler, 2 gloo processes.
5. Memory: the bytes of live tensors each of 2 processes holds after an AdamW step, per
   strategy (DDP, FSDP2, and DeepSpeed's ZeRO stages when DeepSpeed is installed).
6. Launch: start-to-exit of a 2-process no-op through `accel launch` against torchrun, interleaved
   (`launch_bench.py`).
7. N-D parallelism (`parallel`, not in the default list): per-rank parameter + gradient +
   optimizer bytes for DDP / FSDP2 / TP on 2 gloo processes and FSDP2 x TP (2 x 2) on 4, against
   the theoretical share, and the step time of each through accel against the same composition
   written with raw torch (`parallel_bench.py`).

`--sections steps,import,checkpoint,loader,memory,launch[,parallel]` picks what runs (default: all but parallel); other
arguments go to the step benchmark (`--reduce` adds a step with `accelerator.reduce(loss)`, with the
stuck-collective watchdog on and off, against raw DDP with `dist.all_reduce`). Prints markdown tables and writes each section's
figures as data (`<section>.json`, and `.csv` for steps and memory) to `--out-dir`
(default docs/assets/benchmarks, where `plot.py` draws them for docs/performance.md).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).parent
OUT_DIR = HERE.parents[2] / "docs" / "assets" / "benchmarks"
MEMORY_STRATEGIES = ["ddp", "fsdp2"]
DEEPSPEED_STAGES = ["deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3"]


def machine() -> dict[str, Any]:
    """Where and when a figure was measured: it travels with the figure."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }


def save(out_dir: Path, section: str, data: Any, rows: list[dict[str, Any]] | None = None) -> None:
    """`<section>.json` (the data and the machine), and `<section>.csv` of `rows` when given."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{section}.json").write_text(json.dumps({"machine": machine(), "data": data}, indent=2) + "\n")
    if rows:
        with (out_dir / f"{section}.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def import_cost(statement: str) -> float:
    """Import time of `statement` in microseconds: the sum of its top-level imports' cumulative
    times from -X importtime (`from accel import Accelerator` imports `accel`, then the engine)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement], capture_output=True, text=True, check=True
    )
    total = 0.0
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", line)  # one space: a top-level import
        if m:
            total += float(m.group(1))
    if not total:
        raise RuntimeError(f"no import time line for {statement!r}")
    return total


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


def launch_json(worker: list[str], nproc: int) -> dict[str, float]:
    """Run `worker` (plus `--out FILE`) directly or under `accel launch` and read its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        prefix = (
            [sys.executable]
            if nproc == 1
            else [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc)]
        )
        subprocess.run([*prefix, *worker, "--out", str(out)], check=True, timeout=1800)
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def checkpoint_table(out_dir: Path, extra: list[str]) -> None:
    """io_bench's checkpoint rounds in one process, then in 2 gloo processes (DDP: rank 0 writes, both load)."""
    m = launch_json([str(HERE / "io_bench.py"), "checkpoint", *extra], nproc=1)
    m["two_processes"] = launch_json([str(HERE / "io_bench.py"), "checkpoint", *extra], nproc=2)
    save(out_dir, "checkpoint", m)
    for title, run in (("one process", m), ("2 gloo processes, DDP, rank 0 writes, both load", m["two_processes"])):
        print(f"\n## Checkpoints, {title}: model + AdamW state, median of paired per-round ratios (time)\n")
        print(
            "| size | operation | accel / baseline: median (min-max) | accel | baseline | CPU, accel / baseline | load |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for size in run["sizes"].values():
            load = size["load_average_1min"]
            for label, r in size["ratios"].items():
                ours, base = (size["median_seconds"][k] * 1e3 for k in r["of"])
                cpu_ours, cpu_base = (size["median_cpu_seconds"][k] * 1e3 for k in r["of"])
                print(
                    f"| {size['megabytes']:.0f} MB | {label} | {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | "
                    f"{ours:.0f} ms | {base:.0f} ms | {cpu_ours:.0f} / {cpu_base:.0f} ms | "
                    f"{load['min']:.1f}-{load['max']:.1f} |"
                )


def loader_table(out_dir: Path) -> None:
    m = launch_json([str(HERE / "io_bench.py"), "loader"], nproc=2)
    save(out_dir, "loader", m)
    plain = m["plain_distributed_sampler"]
    print("\n## Data loading, 2 gloo processes: samples per second per rank (median epoch)\n")
    print("| loader | samples/s | / plain DataLoader + DistributedSampler |")
    print("| --- | --- | --- |")
    for name in ("plain_distributed_sampler", "accel", "accel_dispatch"):
        print(f"| {name} | {m[name]:.0f} | {m[name] / plain:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--sections", default="steps,import,checkpoint,loader,memory,launch")
    parser.add_argument("--checkpoint-args", default="", help="options for io_bench.py checkpoint (quoted)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where each section's JSON/CSV goes")
    known, extra = parser.parse_known_args()
    sections = set(known.sections.split(","))
    if "steps" in sections:
        step_table(extra, known.out_dir)
    if "import" in sections:
        import_table(known.out_dir)
    if "checkpoint" in sections:
        checkpoint_table(known.out_dir, known.checkpoint_args.split())
    if "loader" in sections:
        loader_table(known.out_dir)
    if "memory" in sections:
        memory_table(known.out_dir)
    if "parallel" in sections:
        parallel_table(known.out_dir)
    if "launch" in sections:
        launch_table(known.out_dir)


def launch_table(out_dir: Path) -> None:
    """`launch_bench.py`: start-to-exit of a 2-process no-op, `accel launch` against torchrun, interleaved."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "launch.json"
        subprocess.run([sys.executable, str(HERE / "launch_bench.py"), "--out", str(out)], check=True, timeout=1800)
        m = json.loads(out.read_text())
    save(out_dir, "launch", m)
    load = m["load_average_1min"]
    print(
        f"\n## Launch: 2-process no-op, start to exit ({m['rounds']} interleaved rounds, load {load['before']}-{load['after']})\n"
    )
    print("| | torchrun | accel launch | accel / torchrun: median of paired ratios (IQR; 95% interval of the median) |")
    print("| --- | --- | --- | --- |")
    for label, times, key in (("wall", "median_seconds", "ratio"), ("CPU", "median_cpu_seconds", "cpu_ratio")):
        med = m[times]
        low, high = m[f"{key.replace('ratio', 'interquartile')}_accel_over_torchrun"]
        ci_low, ci_high = m[f"{key.replace('ratio', 'median_95ci')}_accel_over_torchrun"]
        ratio = m[f"{key}_accel_over_torchrun"]
        print(
            f"| {label} | {med['torchrun']:.3f} s | {med['accel launch']:.3f} s | {ratio:.3f} ({low:.3f}-{high:.3f}; "
            f"{ci_low:.3f}-{ci_high:.3f}) |"
        )
    own = m["accel_launch_before_torchrun"]
    print(
        f"\naccel launch's own work before torchrun starts: {own['wall_ms']:.0f} ms ({own['cpu_ms']:.0f} ms CPU), "
        f"{100 * own['share_of_torchrun_median']:.1f}% of torchrun's median launch"
    )


def parallel_table(out_dir: Path) -> None:
    """`parallel_bench.py` on 2 processes (DDP, FSDP2, TP) and 4 (FSDP2 x TP); one `parallel.json`."""
    runs = [launch_json([str(HERE / "parallel_bench.py")], nproc=n) for n in (2, 4)]
    data = {**runs[0], "layouts": {**runs[0]["layouts"], **runs[1]["layouts"]}}
    save(out_dir, "parallel", data)
    print(f"\n## N-D parallelism: {data['model']['parameters']:,} parameters, per rank after an AdamW step\n")
    print(
        "| layout | processes | MB per rank (params + grads + AdamW) | share of one process | theoretical | accel / raw step (median, range) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, m in data["layouts"].items():
        mb = max(sum(b.values()) for b in m["per_rank_bytes"]) / 2**20
        share = max(m["per_rank_over_single"])
        rounds = m["ratio_rounds"]
        print(
            f"| {name} | {m['processes']} | {mb:.2f} | {share:.4f} | {m['theoretical_share']:.4f} "
            f"| {m['ratio_median']:.3f} ({rounds[0]:.2f}-{rounds[-1]:.2f}) |"
        )


def memory_table(out_dir: Path) -> None:
    strategies = MEMORY_STRATEGIES + (DEEPSPEED_STAGES if importlib.util.find_spec("deepspeed") else [])
    results = [launch_json([str(HERE / "memory_bench.py"), "--strategy", s], nproc=2) for s in strategies]
    rows = [
        {
            "strategy": r["strategy"],
            "processes": r["processes"],
            "parameters": r["parameters"],
            "per_rank_mb": round(max(r["per_rank_bytes"]) / 2**20, 2),
            "single_process_mb": round(r["single_process_model_state_bytes"] / 2**20, 2),
        }
        for r in results
    ]
    save(out_dir, "memory", results, rows)
    print("\n## Memory per rank after an AdamW step, 2 processes (live tensor storage, largest rank)\n")
    print("| strategy | MB per rank | one process, no strategy (MB) | ratio |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        ratio = row["per_rank_mb"] / row["single_process_mb"]
        print(f"| {row['strategy']} | {row['per_rank_mb']:.1f} | {row['single_process_mb']:.1f} | {ratio:.2f} |")


def _ratio(rounds: list[float]) -> str:
    """Median of the per-round (paired) ratios and their range."""
    return f"{_median(rounds):.3f} ({rounds[0]:.2f}-{rounds[-1]:.2f})"


def _median(rounds: list[float]) -> float:
    mid = len(rounds) // 2
    return rounds[mid] if len(rounds) % 2 else (rounds[mid - 1] + rounds[mid]) / 2


def step_table(extra: list[str], out_dir: Path) -> None:
    steps = step_times(extra)
    rows = []
    for hidden, m in steps.items():
        row: dict[str, Any] = {"hidden": int(hidden)}
        row |= {f"{name}_ms": round(m[name] * 1e3, 4) for name in ("raw_ddp_default", "raw_ddp_same_settings", "accel")}
        for key, rounds in m["paired_round_ratios"].items():
            row[f"{key} median"] = round(_median(rounds), 4)
            row[f"{key} min"], row[f"{key} max"] = round(rounds[0], 4), round(rounds[-1], 4)
        rows.append(row)
    save(out_dir, "steps", steps, rows)
    print("\n## Step time, 2 gloo processes (median ms per step; ratios: median of per-round ratios, range)\n")
    print(
        "| hidden | raw DDP (defaults) | raw DDP (same settings) | accel | accel / raw defaults | accel / raw same settings "
        "| raw same settings / raw defaults |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for hidden, m in steps.items():
        naive, same, ours = m["raw_ddp_default"], m["raw_ddp_same_settings"], m["accel"]
        r = m["paired_round_ratios"]
        print(
            f"| {hidden} | {naive * 1e3:.3f} | {same * 1e3:.3f} | {ours * 1e3:.3f} | "
            f"{_ratio(r['accel/raw_ddp_default'])} | {_ratio(r['accel/raw_ddp_same_settings'])} | "
            f"{_ratio(r['raw_ddp_same_settings/raw_ddp_default'])} |"
        )
    print("\n## Python calls per step (cProfile, rank 0; independent of machine load)\n")
    names = list(next(iter(steps.values()))["python_calls_per_step"])
    print("| hidden | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for hidden, m in steps.items():
        print(f"| {hidden} | " + " | ".join(f"{m['python_calls_per_step'][n]:.0f}" for n in names) + " |")
    if any("accel_keep_grads/raw_ddp_same_settings_keep_grads" in m["paired_round_ratios"] for m in steps.values()):
        print("\n## zero_grad(set_to_none=False) (--keep-grads): gradients stay views of DDP's buckets\n")
        print(
            "| hidden | raw same settings, keep grads (ms) | accel, keep grads (ms) | accel / raw | keep / set_to_none (raw) |"
        )
        print("| --- | --- | --- | --- | --- |")
        for hidden, m in steps.items():
            r = m["paired_round_ratios"]
            print(
                f"| {hidden} | {m['raw_ddp_same_settings_keep_grads'] * 1e3:.3f} | {m['accel_keep_grads'] * 1e3:.3f} | "
                f"{_ratio(r['accel_keep_grads/raw_ddp_same_settings_keep_grads'])} | "
                f"{_ratio(r['raw_ddp_same_settings_keep_grads/raw_ddp_same_settings'])} |"
            )
    if any("accel_reduce/accel_reduce_unwatched" in m["paired_round_ratios"] for m in steps.values()):
        print("\n## A reduce through accel every step (--reduce): the stuck-collective watchdog's cost\n")
        print("| hidden | raw + all_reduce (ms) | accel + reduce (ms) | accel / raw | watchdog on / off |")
        print("| --- | --- | --- | --- | --- |")
        for hidden, m in steps.items():
            r = m["paired_round_ratios"]
            print(
                f"| {hidden} | {m['raw_ddp_same_settings_reduce'] * 1e3:.3f} | {m['accel_reduce'] * 1e3:.3f} | "
                f"{_ratio(r['accel_reduce/raw_ddp_same_settings_reduce'])} | "
                f"{_ratio(r['accel_reduce/accel_reduce_unwatched'])} |"
            )
    if any("raw_ddp_explicit_25mb/raw_ddp_same_settings" in m["paired_round_ratios"] for m in steps.values()):
        print("\n## DDP with bucket_cap_mb=25 passed explicitly (--explicit-bucket): first bucket 25 MB, not 1 MB\n")
        print("| hidden | raw same settings (ms) | explicit 25 MB (ms) | explicit / same settings |")
        print("| --- | --- | --- | --- |")
        for hidden, m in steps.items():
            r = m["paired_round_ratios"]["raw_ddp_explicit_25mb/raw_ddp_same_settings"]
            print(
                f"| {hidden} | {m['raw_ddp_same_settings'] * 1e3:.3f} | {m['raw_ddp_explicit_25mb'] * 1e3:.3f} | {_ratio(r)} |"
            )


def import_table(out_dir: Path) -> None:
    torch_us = import_cost("import torch")
    accel_us = import_cost("from accel import Accelerator")
    save(out_dir, "import", {"torch_ms": torch_us / 1e3, "accel_ms": accel_us / 1e3})
    print("\n## Import cost (cumulative, -X importtime)\n")
    print("| import torch | from accel import Accelerator (includes torch) | accel's own share |")
    print("| --- | --- | --- |")
    print(
        f"| {torch_us / 1e3:.0f} ms | {accel_us / 1e3:.0f} ms | {(accel_us - torch_us) / 1e3:.0f} ms ({accel_us / torch_us:.2f}x) |"
    )


if __name__ == "__main__":
    main()
