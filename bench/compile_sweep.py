"""Figures of the compile-mode sweep against the eager sweep, and its projection for a slow compiler.

Runs ``neuron-conformance ops`` on a stratified slice of op_db (every N-th op by name, both directions,
every input family) under the ``exact`` profile, once eager (``--target neuron``) and once compiled
(``--target neuron:compile``), with no reference cache, and prints:
  1. each sweep's cases, samples and wall time, and their ratio (goal: compile at most 2x eager);
  2. the graphs the compiled sweep compiled (samples compiled together: one graph per batch) against its
     samples (what a graph per sample would compile);
  3. the projected time of the whole compiled sweep on this machine with a compiler that takes
     ``--latency`` seconds a graph (neuronx-cc takes seconds to minutes), batched and per sample.
Prints figures only; it asserts nothing.

    python bench/compile_sweep.py [--every 10] [-j 2] [--latency 2.0] [--families all]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ops(every: int) -> tuple[list[str], int]:
    from op_tests.sources import op_db

    names = sorted({op.name for op in op_db()})
    return names[::every], len(names)


def _sweep(ops: list[str], target: str, jobs: int, families: str, out: str) -> tuple[float, list[dict]]:
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-conformance")
    jsonl = os.path.join(out, "cases.jsonl")
    start = time.perf_counter()
    subprocess.run([exe, "ops", "--ops", ",".join(ops), "--target", target, "--emulator-profile", "exact",
                    "--families", families, "-j", str(jobs), "--results", os.path.join(out, "runs"),
                    "--no-reference-cache", "--jsonl", jsonl], capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in open(jsonl)] if os.path.exists(jsonl) else []
    return wall, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=10, help="every N-th op of op_db, by name")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds a graph for the projection")
    parser.add_argument("--families", default="all")
    args = parser.parse_args()
    ops, total_ops = _ops(args.every)
    print(f"{len(ops)} of {total_ops} ops (every {args.every}th), -j {args.jobs}, profile exact, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    figures = {}
    for target in ("neuron", "neuron:compile"):
        with tempfile.TemporaryDirectory() as out:
            wall, rows = _sweep(ops, target, args.jobs, args.families, out)
        samples = sum(r["outcome"]["evidence"].get("samples", 0) for r in rows)
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["outcome"]["status"]] = statuses.get(r["outcome"]["status"], 0) + 1
        graphs = sum((r["outcome"]["evidence"].get("compile") or {}).get("graphs", 0) for r in rows)
        figures[target] = (wall, len(rows), samples, graphs)
        print(f"{target:15s} {len(rows):5d} cases, {samples:6d} samples in {wall:7.1f} s; outcomes {statuses}"
              + (f"; {graphs} graphs compiled" if graphs else ""))
    eager, compiled = figures["neuron"], figures["neuron:compile"]
    ratio = compiled[0] / eager[0] if eager[0] else float("nan")
    print(f"compile / eager wall time: {ratio:.2f}x (goal: 2x at most)")
    scale = total_ops / max(1, len(ops))
    graphs, samples = compiled[3] * scale, compiled[2] * scale
    base = compiled[0] * scale
    print(f"projected whole sweep on this machine: eager {eager[0] * scale / 60:.1f} min, compiled {base / 60:.1f} min")
    print(f"with a compiler taking {args.latency:g} s a graph on {args.jobs} workers: batched "
          f"({graphs:.0f} graphs) {(base + graphs * args.latency / args.jobs) / 3600:.1f} h; a graph per sample "
          f"({samples:.0f} graphs) {(base + samples * args.latency / args.jobs) / 3600:.1f} h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
