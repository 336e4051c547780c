"""accel-cuda benchmark: the adapter's step overhead, and tokens/s of a small transformer.

    python packages/accel-cuda/benchmarks/run.py            # emulated on CPU; adds GPU runs when one is present
    python packages/accel-cuda/benchmarks/run.py --no-gpu   # emulation only

1. Emulated (`--adapter cuda --emulate`, 2 gloo processes): step time through accel against
   raw DDP with the same settings, interleaved in one process group, for MLPs of hidden
   size 64, 512 and 2048.
2. On a GPU (`--adapter cuda`, one process per GPU, at most 2): the same ratio against raw
   PyTorch on CUDA (raw DDP over NCCL with 2+ GPUs, a plain loop with one), then tokens/s
   of a 6-layer, 512-wide decoder (seq 512, batch 16, bf16) eager, compiled whole, and
   compiled region by region.

Prints markdown tables; the figures go into docs/performance.md (and docs/dev/benchmark-log.md) by hand.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent


def launch(nproc: int, adapter_args: list[str], worker_args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(nproc), *adapter_args]
        cmd += [str(HERE / "step_worker.py"), "--out", str(out), *worker_args]
        subprocess.run(cmd, check=True, timeout=1800)
        return json.loads(out.read_text())


def overhead_table(title: str, data: dict, raw_name: str) -> None:
    print(f"\n## {title} ({data['device']}, {data['processes']} process(es); median ms per step)\n")
    print(f"| hidden | {raw_name} | accel-cuda | accel / raw |")
    print("| --- | --- | --- | --- |")
    for hidden, m in data["result"].items():
        print(f"| {hidden} | {m['raw'] * 1e3:.3f} | {m['accel'] * 1e3:.3f} | {m['accel'] / m['raw']:.3f} |")


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU runs even when a GPU is present")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sizes", default="64,512,2048")
    args = parser.parse_args()
    common = ["--rounds", str(args.rounds), "--steps", str(args.steps), "--sizes", args.sizes]

    emulated = launch(2, ["--adapter", "cuda", "--emulate"], ["--task", "overhead", *common])
    overhead_table("Step overhead, emulated (2 gloo processes on the CPU)", emulated, "raw DDP, same settings")

    gpus = 0 if args.no_gpu else gpu_count()
    if not gpus:
        print("\n(no GPU here: the CUDA rows need `run.py` on a machine with one)")
        return
    nproc = min(gpus, 2)
    real = launch(nproc, ["--adapter", "cuda"], ["--task", "overhead", *common])
    overhead_table("Step overhead on CUDA", real, "raw DDP over NCCL" if nproc > 1 else "raw PyTorch loop")

    print(f"\n## Small transformer, bf16 ({nproc} GPU process(es); 6 layers, d=512, seq 512, batch 16)\n")
    print("| compile | first step (s) | ms per step | tokens/s | vs eager |")
    print("| --- | --- | --- | --- | --- |")
    eager_tps = None
    for mode in ("no", "whole", "regional"):
        tr = launch(nproc, ["--adapter", "cuda"], ["--task", "transformer", "--compile", mode, "--rounds", "5"])
        r = tr["result"]
        eager_tps = eager_tps or r["tokens_per_s"]
        print(
            f"| {mode} | {r['first_step_s']:.2f} | {r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
            f"{r['tokens_per_s'] / eager_tps:.2f}x |"
        )


if __name__ == "__main__":
    main()
