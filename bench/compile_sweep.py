"""Figures of the compile-mode sweep against the eager sweep, and its projection for a slow compiler.

Runs ``neuron-conformance ops`` on a stratified slice of op_db (every N-th op by name, both directions,
every input strategy) under the ``exact`` profile, once eager (``--target neuron``) and once compiled
(``--target neuron:compile``), with no reference cache, and prints:
  1. each sweep's cases, samples and wall time, and their ratio (goal: compile at most 2x eager);
  2. the graphs the compiled sweep compiled (samples compiled together: one graph per batch) against its
     samples (what a graph per sample would compile);
  3. the projected time of the whole compiled sweep on this machine with a compiler that takes
     ``--latency`` seconds a graph (neuronx-cc takes seconds to minutes), batched and per sample.
With ``--inductor`` it runs the ``cpu:compile`` slice instead (inductor, a compiler no one here wrote, as
ground truth), keeps its results and reproducers under ``--results`` (``artifacts/<build>/repro/<case>/``), and
prints its wall time, outcomes, the projected time of the whole sweep, and every case that did not pass.
Prints figures only; it asserts nothing.

    python bench/compile_sweep.py [--every 10] [-j 2] [--latency 2.0] [--strategies all]
    python bench/compile_sweep.py --inductor --every 20 --directions forward --strategies none --results runs/inductor

With ``--catch-rate`` it measures how many samples a compile-only fault is caught in: the emulated device's
ops perturbed by 0.5% (``perturb@OP,rel=0.005``), once in eager code (``mode=eager``, target ``neuron``: the
samples where the fault shows at all) and once only inside compiled graphs (``mode=compile``, target
``neuron:compile``); it prints the samples caught under compile of those that show the fault in eager mode.

    python bench/compile_sweep.py --catch-rate [--catch-ops tanh=aten::tanh,...] [--strategies all]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ops(every: int) -> tuple[list[str], int]:
    from op_tests.sources import catalogue

    names = sorted({entry.name for entry in catalogue().values()})
    return names[::every], len(names)


def _sweep(ops: list[str], target: str, jobs: int, strategies: str, out: str, *extra: str) -> tuple[float, list[dict]]:
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-conformance")
    jsonl = os.path.join(out, "cases.jsonl")
    start, cpu = time.perf_counter(), _children_cpu()
    subprocess.run([exe, "ops", "--ops", ",".join(ops), "--target", target, "--emulator-profile", "exact",
                    "--strategies", strategies, "-j", str(jobs), "--results", os.path.join(out, "runs"),
                    "--no-reference-cache", "--jsonl", jsonl, *extra], capture_output=True, text=True, cwd=REPO)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    rows = [json.loads(line) for line in open(jsonl)] if os.path.exists(jsonl) else []
    if rows:
        rows[0]["cpu_s"] = cpu  # the run's processor time, which other work on the machine inflates far less
    return wall, rows


def _children_cpu() -> float:
    """Processor seconds (user + system) of every finished child process and its children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=10, help="every N-th op of op_db, by name")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--latency", type=float, default=2.0, help="seconds a graph for the projection")
    parser.add_argument("--strategies", "--families", dest="strategies", default="all",
                        help="input strategies, comma-separated; 'all' or 'none' (--families: its old name)")
    parser.add_argument("--inductor", action="store_true", help="the cpu:compile slice (inductor) only")
    parser.add_argument("--directions", default="forward,backward")
    parser.add_argument("--hypothesis-examples", default="16")
    parser.add_argument("--results", default="", help="--inductor: keep results and reproducers in this folder")
    parser.add_argument("--timeout", default="1800", help="--inductor: per-case timeout, seconds")
    parser.add_argument("--report-only", action="store_true",
                        help="--inductor: print the figures of the cases already in --results (every *.jsonl there: "
                             "a run stopped early, and the runs that went on with the rest of its cases)")
    parser.add_argument("--catch-rate", action="store_true", help="samples a compile-only fault is caught in")
    parser.add_argument("--dtypes", default="float32", help="--catch-rate: the dtypes")
    parser.add_argument("--catch-ops", default="tanh=aten::tanh,exp=aten::exp,sigmoid=aten::sigmoid,mul=aten::mul,"
                        "sum=aten::sum,mm=aten::mm,softmax=aten::_softmax,"
                        "nn.functional.layer_norm=aten::native_layer_norm",
                        help="OP=ATEN_OP,...: the op of op_db and the ATen op its fault perturbs")
    args = parser.parse_args()
    if args.catch_rate:
        return _catch_rate(args)
    ops, total_ops = _ops(args.every)
    if args.inductor:
        return _inductor(args, ops, total_ops)
    print(f"{len(ops)} of {total_ops} ops (every {args.every}th), -j {args.jobs}, profile exact, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    figures = {}
    for target in ("neuron", "neuron:compile"):
        with tempfile.TemporaryDirectory() as out:
            wall, rows = _sweep(ops, target, args.jobs, args.strategies, out)
        samples = sum(r["outcome"]["evidence"].get("samples", 0) for r in rows)
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["outcome"]["status"]] = statuses.get(r["outcome"]["status"], 0) + 1
        graphs = sum((r["outcome"]["evidence"].get("compile") or {}).get("graphs", 0) for r in rows)
        direct = sum((r["outcome"]["evidence"].get("compile") or {}).get("direct", 0) for r in rows)
        figures[target] = (wall, len(rows), samples, graphs, rows[0]["cpu_s"] if rows else 0.0)
        print(f"{target:15s} {len(rows):5d} cases, {samples:6d} samples in {wall:7.1f} s "
              f"({figures[target][4]:.0f} processor-seconds); outcomes {statuses}"
              + (f"; {graphs} graphs compiled, {direct} of them built without dynamo" if graphs else ""))
        for r in rows:
            if r["outcome"]["status"] not in ("pass", "skip"):
                print(f"    {r['title']}: {r['outcome']['status']}: {r['outcome']['message'][:160]}")
    eager, compiled = figures["neuron"], figures["neuron:compile"]
    ratio = compiled[0] / eager[0] if eager[0] else float("nan")
    print(f"compile / eager wall time: {ratio:.2f}x (goal: 2x at most); processor time: "
          f"{compiled[4] / eager[4] if eager[4] else float('nan'):.2f}x; load average now {os.getloadavg()[0]:.1f}")
    scale = total_ops / max(1, len(ops))
    graphs, samples = compiled[3] * scale, compiled[2] * scale
    base = compiled[0] * scale
    print(f"projected whole sweep on this machine: eager {eager[0] * scale / 60:.1f} min, compiled {base / 60:.1f} min")
    print(f"with a compiler taking {args.latency:g} s a graph on {args.jobs} workers: batched "
          f"({graphs:.0f} graphs) {(base + graphs * args.latency / args.jobs) / 3600:.1f} h; a graph per sample "
          f"({samples:.0f} graphs) {(base + samples * args.latency / args.jobs) / 3600:.1f} h")
    return 0


def _slice_cases(ops: list[str], args) -> list:
    from op_tests.sources import OpSelection, all_cases

    strategies = () if args.strategies == "none" else tuple(args.strategies.split(",")) if args.strategies != "all" else None
    if strategies is None:
        from op_tests.strategies import STRATEGIES

        strategies = tuple(STRATEGIES)
    return all_cases(OpSelection(patterns=tuple(ops), directions=tuple(args.directions.split(",")),
                                 hypothesis_examples=int(args.hypothesis_examples), strategies=strategies))


def _inductor(args, ops: list[str], total_ops: int) -> int:
    out = os.path.abspath(args.results or tempfile.mkdtemp(prefix="inductor-sweep-"))
    os.makedirs(out, exist_ok=True)
    print(f"cpu:compile (inductor): {len(ops)} of {total_ops} ops (every {args.every}th), directions "
          f"{args.directions}, input strategies {args.strategies}, hypothesis examples {args.hypothesis_examples}, "
          f"-j {args.jobs}, load average {os.getloadavg()[0]:.1f} at start; results in {out}")
    if args.report_only:  # the cases a stopped run finished; wall time: their own time over the workers
        rows = [json.loads(line) for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))) for line in open(path)]
        wall = sum(r["outcome"].get("duration_s") or 0.0 for r in rows) / args.jobs
        print(f"report only: {len(rows)} cases finished; wall time estimated as their own time / {args.jobs}")
    else:
        wall, rows = _sweep(ops, "cpu:compile", args.jobs, args.strategies, out, "--directions", args.directions,
                            "--hypothesis-examples", args.hypothesis_examples, "--timeout", args.timeout,
                            "--build", "inductor")
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r["outcome"]["status"]] = statuses.get(r["outcome"]["status"], 0) + 1
    samples = sum(r["outcome"]["evidence"].get("samples", 0) for r in rows)
    graphs = sum((r["outcome"]["evidence"].get("compile") or {}).get("graphs", 0) for r in rows)
    own = sum(r["outcome"].get("duration_s") or 0.0 for r in rows)
    print(f"{len(rows)} cases, {samples} samples, {graphs} graphs in {wall:.0f} s wall ({own:.0f} s in cases); "
          f"outcomes {statuses}")
    planned = len(_slice_cases(ops, args))
    scale = total_ops / max(1, len(ops)) * planned / max(1, len(rows))
    print(f"{len(rows)} of the slice's {planned} cases; projected for all {total_ops} ops with these directions and "
          f"input strategies: {wall * scale / 3600:.1f} h on {args.jobs} workers")
    for r in sorted(rows, key=lambda r: r["title"]):
        if r["outcome"]["status"] not in ("pass", "skip"):
            repro = r["outcome"].get("repro") or ""
            print(f"  {r['outcome']['status']:9s} {r['title']}: {r['outcome']['message'][:160]}"
                  + (f" [{os.path.relpath(repro, out)}]" if repro else ""))
    return 0


def _catch_rate(args) -> int:
    aten = dict(pair.split("=") for pair in args.catch_ops.split(","))
    ops = list(aten)
    failing: dict[str, dict[str, list[bool]]] = {}
    for target, mode in (("neuron", "eager"), ("neuron:compile", "compile")):
        faults = ";".join(f"perturb@{name},rel=0.005,mode={mode}" for name in aten.values())
        os.environ["NEURON_VALIDATE_FAULTS"] = faults
        with tempfile.TemporaryDirectory() as out:
            wall, rows = _sweep(ops, target, args.jobs, args.strategies, out, "--directions", args.directions,
                                "--hypothesis-examples", args.hypothesis_examples, "--dtypes", args.dtypes)
        del os.environ["NEURON_VALIDATE_FAULTS"]
        failing[mode] = {r["title"]: [s not in ("pass", "skip") for s in r["outcome"]["evidence"].get("sample_statuses", [])]
                         for r in rows}
        print(f"{target:15s} faults {mode}: {len(rows)} cases in {wall:.0f} s")
    shown = caught = 0
    missed = []
    for title, eager in failing["eager"].items():
        compiled = failing["compile"].get(title, [])
        if len(compiled) != len(eager):
            continue  # not comparable sample by sample (a case that died or was skipped whole)
        for i, (e, c) in enumerate(zip(eager, compiled)):
            shown += e
            caught += e and c
            if e and not c:
                missed.append(f"{title} sample {i}")
    print(f"compile-only faults ({', '.join(aten.values())}, rel=0.005): caught in {caught} of {shown} samples "
          f"that show them in eager mode ({100 * caught / max(1, shown):.1f}%; goal: 95%)")
    for m in missed[:20]:
        print(f"  missed: {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
