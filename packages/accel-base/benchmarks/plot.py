"""Draws the benchmark figures that docs/performance.md embeds, from the data run.py wrote.

    python packages/accel-base/benchmarks/plot.py [--data docs/assets/benchmarks]

- `step_ratios.png` (from steps.json): accel's step time over raw DDP's, by model size:
  the median of per-round paired ratios, with their interquartile range as error bars (the
  full range, in the CSV, is dominated by single rounds on a busy machine). When
  `steps_reference.csv` is there (medians of earlier runs on a quiet machine, copied from
  docs/dev/benchmark-log.md), they are drawn beside as hollow markers with their range, so a
  run on a busy machine can be read against them.
- `memory_by_strategy.png` (from memory.json): the bytes of live tensors per rank after an
  AdamW step, per strategy, against the same model on one process.

Needs matplotlib (`nox -s bench` installs it). A figure whose data file is missing is skipped
with a note.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

HERE = Path(__file__).parent
DATA = HERE.parents[2] / "docs" / "assets" / "benchmarks"
LABELS = {
    "ddp": "DDP",
    "fsdp2": "FSDP2",
    "deepspeed-zero1": "DeepSpeed\nZeRO-1",
    "deepspeed-zero2": "DeepSpeed\nZeRO-2",
    "deepspeed-zero3": "DeepSpeed\nZeRO-3",
}
RATIOS = {
    "accel/raw_ddp_same_settings": "accel / raw DDP, same settings",
    "accel/raw_ddp_default": "accel / raw DDP, PyTorch defaults",
    "raw_ddp_same_settings/raw_ddp_default": "raw DDP same settings / defaults (no accel)",
}


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of sorted `values`."""
    pos = q * (len(values) - 1)
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def _where(machine: dict[str, Any]) -> str:
    return (
        f"{machine['date']}, torch {machine['torch']}, {machine['cpu_cores']} CPU cores, "
        f"load {machine['load_average_1min']}"
    )


def step_ratios(data: dict[str, Any], out: Path, reference: list[dict[str, str]]) -> None:
    steps = data["data"]
    sizes = sorted(steps, key=int)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colors = dict(zip(RATIOS, ("tab:blue", "tab:orange", "tab:green")))
    for shift, key in zip((0.16, 0.22, 0.28), RATIOS):
        rows = sorted(
            (r for r in reference if r["ratio"] == key and r["hidden"] in sizes), key=lambda r: int(r["hidden"])
        )
        if not rows:
            continue
        runs = [sorted(float(v) for v in r["run_medians"].split(";")) for r in rows]
        mids = [_quantile(v, 0.5) for v in runs]
        xs = [sizes.index(r["hidden"]) + shift for r in rows]
        low, high = [m - v[0] for m, v in zip(mids, runs)], [v[-1] - m for m, v in zip(mids, runs)]
        ax.errorbar(xs, mids, yerr=[low, high], fmt="o", mfc="none", color=colors[key], capsize=3, alpha=0.8)
    if reference:
        ax.plot([], [], "o", mfc="none", color="grey", label=f"hollow: {reference[0]['measured_on']}")
    for offset, (key, label) in zip((-0.06, 0.0, 0.06), RATIOS.items()):
        rounds = [sorted(steps[h]["paired_round_ratios"][key]) for h in sizes]
        mids = [_quantile(r, 0.5) for r in rounds]
        low = [m - _quantile(r, 0.25) for m, r in zip(mids, rounds)]
        high = [_quantile(r, 0.75) - m for m, r in zip(mids, rounds)]
        xs = [i + offset for i in range(len(sizes))]
        ax.errorbar(xs, mids, yerr=[low, high], fmt="o-", capsize=4, label=label, color=colors[key])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(sizes)), [f"hidden {h}" for h in sizes])
    ax.set_ylabel("step time ratio (lower is faster)")
    ax.set_title("Step time, 2 gloo processes: median of paired per-round ratios (interquartile range)", fontsize=10)
    ax.legend(fontsize=7)
    fig.text(0.01, 0.01, f"filled: this run, {_where(data['machine'])}", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def memory_by_strategy(data: dict[str, Any], out: Path) -> None:
    results = data["data"]
    names = [LABELS.get(r["strategy"], r["strategy"]) for r in results]
    per_rank = [max(r["per_rank_bytes"]) / 2**20 for r in results]
    single = results[0]["single_process_model_state_bytes"] / 2**20
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bars = ax.bar(names, per_rank, color="tab:blue")
    ax.bar_label(bars, fmt="%.0f MB", fontsize=8)
    ax.axhline(single, color="tab:red", ls="--", lw=1, label=f"one process, no strategy: {single:.0f} MB")
    ax.set_ylim(0, max([*per_rank, single]) * 1.2)
    params = results[0]["parameters"]
    ax.set_ylabel("MB per rank (largest rank)")
    ax.set_title(
        f"Tensors held per rank after an AdamW step: {params / 1e6:.1f}M fp32 parameters, "
        f"{results[0]['processes']} processes",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="upper right")
    fig.text(0.01, 0.01, _where(data["machine"]), fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, default=DATA, help="the folder run.py wrote")
    args = parser.parse_args()
    reference_csv = args.data / "steps_reference.csv"
    reference = list(csv.DictReader(reference_csv.open())) if reference_csv.is_file() else []
    for source, figure in (("steps.json", "step_ratios.png"), ("memory.json", "memory_by_strategy.png")):
        path = args.data / source
        if not path.is_file():
            print(f"{figure}: skipped, no {path} (run run.py first)")
            continue
        data = json.loads(path.read_text())
        if source == "steps.json":
            step_ratios(data, args.data / figure, reference)
        else:
            memory_by_strategy(data, args.data / figure)
        print(f"{figure}: written to {args.data / figure}")


if __name__ == "__main__":
    main()
