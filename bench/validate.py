"""Time to verdict of ``neuron-validate`` on example scripts (goal: 60 s at most each on 2 cores).

Runs the installed command as a user would (``neuron-validate
examples/tiny_gpt.py``, default neuron-2.27 profile: 30 training steps on
each side, layer and op localisation, plots and reports) N times and prints
the wall time of each run, the median, where the time went according to the
report, and for a script that draws random numbers on the device what sharing
the reference's draws cost (draws, bytes logged per step, the target's
training time with shared draws against its own stream). ``--realistic``
runs the realistic scripts (VAE, denoiser, nn.Transformer LM, trainer loop,
transformers GPT-2, tiny GPT). Prints figures only; it asserts nothing.

    python bench/validate.py [--runs 3] [--script examples/tiny_gpt.py ...] [--realistic] [-- extra args]
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
    parser.add_argument("--script", action="append", default=None)
    parser.add_argument("--realistic", action="store_true", help="the realistic scripts, one after another")
    args = parser.parse_args(argv)
    scripts = args.script or ([os.path.join(REPO, "examples", name) for name in REALISTIC] if args.realistic
                              else [os.path.join(REPO, "examples", "tiny_gpt.py")])
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    for script in scripts:
        bench_script(script, args.runs, extra)
    return 0


REALISTIC = ("vae.py", "denoiser.py", "transformer_lm.py", "trainer_loop.py", "hf_gpt2.py", "tiny_gpt.py")


def bench_script(script: str, runs: int, extra: list[str]) -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-validate")
    print(f"neuron-validate {os.path.relpath(script, REPO)} {' '.join(extra)}".rstrip())
    walls = []
    for run in range(runs):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            result = subprocess.run([exe, script, "--out", out, *extra], capture_output=True, text=True,
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
        draws = report.get("randomness") or {}
        if draws.get("on_device"):
            shared, own = draws.get("target_seconds_shared"), draws.get("target_seconds_own")
            ratio = f", {shared / own:.2f}x its own stream's" if shared and own else ""
            print(f"  draws: {draws['on_device']} of {draws['reference']} on the device, shared "
                  f"({', '.join(draws.get('ops_on_device', []))}); log {draws.get('log_bytes_per_step') or 0:.0f} "
                  f"bytes per step; target training {shared or 0:.1f} s with shared draws{ratio}; "
                  f"{draws.get('stream_runs', 0)} other-stream reference runs")
    print(f"median time to verdict: {statistics.median(walls):.1f} s over {len(walls)} runs "
          f"(goal: 60 s); load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    sys.exit(main())
