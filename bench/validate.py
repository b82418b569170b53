"""Time to verdict of ``neuron-validate`` on the tiny GPT example (goal: 60 s at most on 2 cores).

Runs the installed command as a user would (``neuron-validate
examples/tiny_gpt.py``, default neuron-2.27 profile: 30 training steps on
each side, layer and op localisation, plots and reports) N times and prints
the wall time of each run, the median, and where the time went according to
the report. Prints figures only; it asserts nothing.

    python bench/validate.py [--runs 3] [--script examples/tiny_gpt.py] [-- extra neuron-validate args]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--script", default=os.path.join(REPO, "examples", "tiny_gpt.py"))
    args = parser.parse_args(argv)
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-validate")
    print(f"neuron-validate {os.path.relpath(args.script, REPO)} {' '.join(extra)}".rstrip())
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    walls = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            result = subprocess.run([exe, args.script, "--out", out, *extra], capture_output=True, text=True,
                                    cwd=REPO)
            wall = time.perf_counter() - start
            report = json.load(open(os.path.join(out, "report.json"))) if os.path.exists(
                os.path.join(out, "report.json")) else None
        walls.append(wall)
        if report is None:
            print(f"run {run + 1}: exit {result.returncode} after {wall:.1f} s, no report: "
                  f"{result.stderr.strip().splitlines()[-1:] or ''}")
            continue
        t = report["timings"]
        curves = report.get("curves") or {}
        print(f"run {run + 1}: {wall:5.1f} s to verdict '{report['verdict']}' (exit {result.returncode}); "
              f"children {t['total_s']:.1f} s (reference {t['reference_s']:.1f} s, target {t['target_s']:.1f} s, "
              f"in parallel); {curves.get('steps', 0)} steps per side")
    print(f"median time to verdict: {statistics.median(walls):.1f} s over {len(walls)} runs "
          f"(goal: 60 s); load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
