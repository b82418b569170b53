"""Figures of the operator sweep on the emulated device.

Prints, for the selected ops (default: all of op_db, forward and backward, every input strategy):
  0. the cases per source: OpInfo's samples, the hypothesis examples, and each input strategy
     (sizes, extremes, mixed, layouts, variants);
  1. the sweep with -j N: cases, wall time, and time split by generation,
     execution (reference, target) and comparison, summed over workers; time per source;
  2. harness overhead: the harness's time per case with one worker against
     the raw work of the same samples done in a plain loop in one process
     (generate the samples, run them on the reference and on the target), on
     a stratified slice of the cases (``--overhead-only`` for just this);
  3. the same samples checked the way PyTorch's test_compare_cpu does (a
     per-sample torch.testing.assert_close loop), for comparison;
  4. the speedup of a rerun with a warm reference cache (a second build).

Goals: the full forward-and-backward sweep within 20 minutes on 2 cores;
overhead 1.25x at most; warm-cache speedup 1.8x at least.

    python bench/op_sweep.py [--ops GLOB,...] [--dtypes ...] [-j 2] [--profile exact] [--keep DIR] [--overhead-only]
    python bench/op_sweep.py --strategies accumulation --strategies-only --no-warm --no-overhead --profile neuron-2.27

``--strategies-only`` runs the input strategies' cases alone (no OpInfo samples, no hypothesis examples) and
prints how long listing them took; ``--no-warm`` leaves out the second sweep (figure 4).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


def sweep(cases, results, build, jobs, timeout):
    from conformance.settings import RunSettings, default_threads
    from runner.reporters import OnOutcome, StoreWriter
    from runner.suite import run_suite
    from results.store import ResultStore

    settings = RunSettings(target="neuron", timeout_s=timeout, artifacts_dir=os.path.join(results, "artifacts"),
                           reference_cache=os.path.join(results, "reference_cache.sqlite"), warmup=("op",),
                           threads=default_threads(jobs))
    totals: dict[str, float] = {}
    cached = 0

    def collect(case, outcome):
        nonlocal cached
        cached += outcome.cached_reference
        for k, v in outcome.timings.items():
            totals[k] = totals.get(k, 0.0) + v
        source = f"source: {source_of(case)}"
        totals[source] = totals.get(source, 0.0) + outcome.duration_s

    start = time.perf_counter()
    with ResultStore.open(results) as store:
        summary = run_suite(cases, settings=settings, plugins=[StoreWriter(store), OnOutcome(collect)], build_id=build, manifest={}, target_label="neuron",
                            jobs=jobs)
    return time.perf_counter() - start, summary, totals, cached


def source_of(case) -> str:
    """opinfo, hypothesis, or the input strategy's name."""
    return case.config.get("inputs") or case.config.get("source", "opinfo")


def report_verdicts(results: str) -> None:
    """Lists the cases that are neither pass nor skip, and whether the two sweeps agree case by case."""
    from results.store import ResultStore

    with ResultStore.open(results) as store:
        cold = {r.case_id: r for r in store.statuses("cold")}
        warm = {r.case_id: r.status for r in store.statuses("warm")}
    if warm:
        differ = [cold[c].title for c in cold if warm.get(c) != cold[c].status]
        print(f"verdicts of the two sweeps: {len(cold) - len(differ)} of {len(cold)} identical"
              + (f"; differ: {', '.join(differ[:10])}" if differ else ""))
    for r in cold.values():
        if r.status.value not in ("pass", "skip"):
            print(f"  {r.status.value:<12} {r.title}: {r.message[:160]}")


def plain_loops(cases, limit: int):
    """Raw work and the test_compare_cpu-style check, for the first ``limit`` cases, in this process."""
    import torch
    from torch.utils._pytree import tree_leaves

    import emulator
    from op_tests.execute import target_inputs
    from op_tests.samples import generate_samples, sample_parts
    from op_tests.sources import case_op

    emulator.register()
    raw = check = 0.0
    for case in cases[:limit]:
        op = case_op(case)
        backward = case.mode == "backward"
        t0 = time.perf_counter()
        samples = generate_samples(op, case)
        generation = time.perf_counter() - t0
        for run_check in (False, True):
            t0 = time.perf_counter()
            for sample in samples:
                parts = sample_parts(sample)
                results = []
                for device in ("cpu", "neuron"):
                    inp, args, kwargs = parts if device == "cpu" else target_inputs(parts, device)
                    try:
                        out = sample.output_process_fn_grad(op(inp, *args, **kwargs))
                        if backward:
                            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
                            ins = [t for t in tree_leaves((inp, args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
                            if outs and ins:
                                out = torch.autograd.grad(outs, ins, [torch.ones_like(o) for o in outs], allow_unused=True)
                        results.append(out)
                    except Exception:  # noqa: BLE001
                        results.append(None)
                if run_check and results[0] is not None and results[1] is not None:
                    try:
                        torch.testing.assert_close(results[1], results[0], equal_nan=True, check_device=False)
                    except Exception:  # noqa: BLE001
                        pass
            elapsed = time.perf_counter() - t0
            if run_check:
                check += generation + elapsed
            else:
                raw += generation + elapsed
    return raw, check


def overhead(cases, args, results: str, cold_per_case: float | None = None) -> None:
    """Harness against a plain loop on the same stratified slice of cases, both on one core's worth of work.

    The harness runs the slice with one worker (no reference cache, so it
    does the same work as the loop); the time per case is the wall time
    including the worker's start, and the in-case part without it.
    """
    n = min(args.loop_cases, len(cases))
    step = max(1, len(cases) // n)
    sample_cases = cases[::step][:n]
    from conformance.settings import RunSettings, default_threads
    from runner.reporters import OnOutcome, StoreWriter
    from runner.suite import run_suite
    from results.store import ResultStore

    in_case = 0.0

    def collect(case, outcome):
        nonlocal in_case
        in_case += sum(outcome.timings.values())

    settings = RunSettings(target="neuron", timeout_s=args.timeout, artifacts_dir=os.path.join(results, "artifacts"),
                           warmup=("op",), threads=default_threads(1))
    start = time.perf_counter()
    with ResultStore.open(os.path.join(results, "overhead")) as store:
        run_suite(sample_cases, settings=settings, plugins=[StoreWriter(store), OnOutcome(collect)], build_id="overhead-j1", manifest={},
                  target_label="neuron", jobs=1)
    harness = (time.perf_counter() - start) / len(sample_cases)
    raw, check = plain_loops(sample_cases, n)
    raw_per_case, check_per_case = raw / len(sample_cases), check / len(sample_cases)
    print(f"overhead on the same {len(sample_cases)} cases (every {step}th), one worker vs a plain loop in one process:")
    print(f"  raw work per case (generate + run both sides): {raw_per_case * 1e3:.1f} ms")
    print(f"  harness per case: {harness * 1e3:.1f} ms wall (worker start included), {in_case / len(sample_cases) * 1e3:.1f} ms "
          f"in the case; overhead {harness / raw_per_case:.2f}x wall, {in_case / len(sample_cases) / raw_per_case:.2f}x "
          f"in the case (goal <= 1.25x)")
    if cold_per_case is not None:
        print(f"  (the full sweep with -j {args.jobs}: {cold_per_case * 1e3:.1f} ms per case per worker; "
              f"two workers share the memory bandwidth of two cores)")
    print(f"test_compare_cpu-style assert_close loop per case: {check_per_case * 1e3:.1f} ms "
          f"(no golden, no isolation, no store, one verdict rule)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="*")
    parser.add_argument("--dtypes", default="")
    parser.add_argument("--directions", default="forward,backward")
    parser.add_argument("--strategies", "--families", dest="strategies", default="all",
                        help="input strategies, comma-separated; 'all' or 'none' (--families: its old name)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--profile", default="exact")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--loop-cases", type=int, default=300, help="cases measured by the in-process loops")
    parser.add_argument("--overhead-only", action="store_true", help="only the overhead and test_compare_cpu figures")
    parser.add_argument("--no-overhead", action="store_true", help="leave out the overhead and test_compare_cpu figures")
    parser.add_argument("--strategies-only", "--families-only", dest="strategies_only", action="store_true",
                        help="only the input strategies' cases (no OpInfo samples, no hypothesis examples)")
    parser.add_argument("--no-warm", action="store_true", help="leave out the rerun with a warm reference cache")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="keep the results store here (builds 'cold' and 'warm') instead of a temporary folder")
    args = parser.parse_args()
    os.environ["NEURON_VALIDATE_EMULATOR_PROFILE"] = args.profile

    from collections import Counter

    from op_tests.strategies import STRATEGIES
    from op_tests.sources import OpSelection, all_cases, strategy_cases

    split = lambda s: tuple(x for x in s.split(",") if x)  # noqa: E731
    strategies = STRATEGIES if args.strategies == "all" else () if args.strategies == "none" else split(args.strategies)
    selection = OpSelection(patterns=split(args.ops) or ("*",), dtypes=split(args.dtypes),
                            directions=split(args.directions), strategies=strategies)
    t0 = time.perf_counter()
    cases = strategy_cases(selection) if args.strategies_only else all_cases(selection)
    print(f"listing the cases took {time.perf_counter() - t0:.1f} s")
    counts = Counter(source_of(c) for c in cases)
    print(f"cases: {len(cases)}; per source: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(),
                                                                                          key=lambda kv: -kv[1])))
    results = args.keep or tempfile.mkdtemp(prefix="op_sweep_")
    try:
        if args.overhead_only:
            overhead(cases, args, results)
            return
        cold, summary, totals, _ = sweep(cases, results, "cold", args.jobs, args.timeout)
        print(f"sweep: {summary.total} cases (profile {args.profile}, -j {args.jobs}) in {cold:.1f} s "
              f"= {cold / 60:.1f} min; outcomes {summary.counts}")
        work = sum(v for k, v in totals.items() if not k.startswith("source: "))
        for key in ("generation", "reference", "target", "comparison"):
            share = totals.get(key, 0.0)
            print(f"  {key:<11} {share:9.1f} s  ({100 * share / work:4.1f}% of in-case time, summed over workers)")
        for key in sorted(k for k in totals if k.startswith("source: ")):
            print(f"  {key:<22} {totals[key]:9.1f} s over {counts[key.removeprefix('source: ')]} cases "
                  "(summed over workers, reproducers included)")
        per_case_harness = cold * args.jobs / max(summary.total, 1)
        if not args.no_warm:
            warm, warm_summary, _, cached = sweep(cases, results, "warm", args.jobs, args.timeout)
            print(f"rerun with a warm reference cache: {warm:.1f} s ({cached} of {warm_summary.total} cases from "
                  f"cache); speedup {cold / warm:.2f}x (goal >= 1.8x)")
        report_verdicts(results)
        if not args.no_overhead:
            overhead(cases, args, results, cold_per_case=per_case_harness)
    finally:
        if not args.keep:
            shutil.rmtree(results, ignore_errors=True)


if __name__ == "__main__":
    main()
