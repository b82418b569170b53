"""Figures of the distributed suites on the emulated device.

Prints the wall time of the 2-rank parity check of the tiny GPT (DDP and
FSDP2 on ``hf/gpt2:causal_lm``, tensor parallelism on the tiny transformer
``flex/causal_lm``), run as a user runs it (the CLI, -j 2), and of the
collectives suite at 2 ranks. Goal: the parity check within 2 minutes on 2 cores.

    python bench/distributed.py [--runs 1] [--collectives]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).with_name("neuron-conformance"))


def timed(args: list[str], results: str) -> tuple[float, str]:
    env = {**os.environ, "NEURON_VALIDATE_EMULATOR_PROFILE": os.environ.get("NEURON_VALIDATE_EMULATOR_PROFILE", "exact")}
    start = time.perf_counter()
    done = subprocess.run([CLI, "distributed", "--results", results, "-j", "2", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - start
    last = [line.strip() for line in done.stdout.splitlines() if "cases ran" in line]
    if not last:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
    return elapsed, last[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--collectives", action="store_true", help="also time the collectives suite at 2 ranks")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_dist_") as tmp:
        times = []
        for k in range(args.runs):
            seconds, line = timed(["--world-size", "2", "--suite", "ddp,fsdp2,tp", "--filter", "hf/gpt2*,flex/*"],
                                  os.path.join(tmp, f"parity{k}"))
            times.append(seconds)
            print(f"parity, 2 ranks, DDP + FSDP2 + TP of the tiny GPT (3 steps each): {seconds:.1f} s ({line})")
        if args.runs > 1:
            print(f"  median of {args.runs}: {sorted(times)[len(times) // 2]:.1f} s (goal: 120 s)")
        if args.collectives:
            seconds, line = timed(["--world-size", "2", "--suite", "collectives"], os.path.join(tmp, "coll"))
            print(f"collectives suite, 2 ranks: {seconds:.1f} s ({line})")


if __name__ == "__main__":
    main()
