"""Scale-out: the speedup of 2 workers over 1, for the local process pool and for Ray, and the
cost per case of writing results to the store.

    .venv/bin/python bench/scale.py [--ops GLOBS] [--dtypes LIST] [--jobs 2] [--no-ray] [--store-rows N]

Each executor runs the same case set (the emulated device, exact profile,
no reference cache, so every run does the same work) through ``run_suite``
into a fresh store: the figures include starting the workers and writing
every result, as a real sweep does. Workers run one torch thread each
(OMP_NUM_THREADS=1), one per core, as a sweep on a cluster node would; a
worker's start (importing torch and the op database, a few seconds) is
paid once per worker and is what keeps a short sweep from reaching the
ideal speedup. Ray's own start (``ray.init``) is outside the timing: a
cluster is up before a sweep begins. The load average is printed because
other processes on the machine change every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_OPS = ("add,sub,mul,div.no_rounding_mode,tanh,sigmoid,exp,log,sin,cos,abs,neg,sqrt,rsqrt,nn.functional.relu,"
               "nn.functional.gelu,nn.functional.silu,maximum,minimum,pow,clamp,where,sum,mean")


def cases(ops: str, dtypes: str):
    from op_tests.sources import OpSelection, all_cases

    return all_cases(OpSelection(patterns=tuple(ops.split(",")), dtypes=tuple(dtypes.split(",")),
                                 directions=("forward", "backward")))


def settings(artifacts: Path):
    from conformance.settings import RunSettings

    return RunSettings(target="neuron", timeout_s=600, artifacts_dir=str(artifacts),
                       env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": "",
                            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def timed_run(selected, *, executor: str, jobs: int) -> tuple[float, dict]:
    from conformance.suite import run_suite
    from results.store import ResultStore

    with tempfile.TemporaryDirectory() as tmp:
        with ResultStore.open(tmp) as store:
            start = time.perf_counter()
            summary = run_suite(selected, settings=settings(Path(tmp) / "artifacts"), store=store, build_id="bench",
                                manifest={}, target_label="neuron (emulated)", jobs=jobs, executor=executor)
            seconds = time.perf_counter() - start
    assert summary.ran == len(selected), summary
    return seconds, summary.counts


def store_cost(rows: int) -> tuple[float, float]:
    """Seconds per result for ``record`` (one committed transaction each) and per result merged."""
    from conformance.case import Case
    from conformance.outcome import Outcome, Status
    from results.store import ResultStore

    evidence = {"samples": 24, "by_status": {"pass": 23, "mismatch": 1}, "metrics": {"max_abs": 3.1e-3, "max_rel": 0.01},
                "failures": [{"sample": 3, "status": "mismatch", "message": "Mismatched elements: 37 / 4096 (0.9%)",
                              "mismatches": [{"path": "output", "index": [2, 17]}]}],
                "executed_ops": [f"aten::op{i}" for i in range(12)]}
    with tempfile.TemporaryDirectory() as tmp:
        with ResultStore.open(Path(tmp) / "a") as store:
            store.ensure_build("bench", target="neuron", label="neuron", manifest={})
            outcomes = []
            for i in range(rows):
                case = Case(kind="op", name=f"op{i % 600}", dtype="float32", mode=("forward", "backward")[i % 2],
                            config={"source": "opinfo", "i": i})
                outcomes.append((case, Outcome(case_id=case.id, status=Status.PASS, message="24 / 24 samples match",
                                               evidence=evidence, duration_s=0.1)))
            start = time.perf_counter()
            for case, outcome in outcomes:
                store.record("bench", case, outcome)
            per_record = (time.perf_counter() - start) / rows
            with ResultStore.open(Path(tmp) / "b") as merged:
                start = time.perf_counter()
                merged.merge(store)
                per_merged = (time.perf_counter() - start) / rows
    return per_record, per_merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--store-rows", type=int, default=2000)
    args = parser.parse_args()

    os.environ.setdefault("NEURON_VALIDATE_EMULATOR_PROFILE", "exact")
    selected = cases(args.ops, args.dtypes)
    load = os.getloadavg()[0]
    print(f"case set: {len(selected)} op cases ({args.dtypes}, forward and backward); {os.cpu_count()} cores; "
          f"one torch thread per worker; load average {load:.2f}", flush=True)

    executors = ["local"] + ([] if args.no_ray else ["ray"])
    results: dict[str, dict[int, float]] = {}
    for executor in executors:
        if executor == "ray":
            import ray

            ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
        label = {"local": "local pool", "ray": "ray"}[executor]
        for jobs in (1, args.jobs):
            seconds, counts = timed_run(selected, executor=executor, jobs=jobs)
            results.setdefault(executor, {})[jobs] = seconds
            per_case = seconds / len(selected)
            print(f"{label:<10} {jobs} worker{'s' if jobs > 1 else ' '}: {seconds:7.1f} s ({per_case * 1e3:6.0f} ms per case; "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})", flush=True)
        speedup = results[executor][1] / results[executor][args.jobs]
        print(f"{label:<10} speedup of {args.jobs} workers over 1: {speedup:.2f}x "
              f"(ideal {args.jobs:.1f}x; goal {0.9 * args.jobs:.1f}x)", flush=True)
        if executor == "ray":
            ray.shutdown()

    per_record, per_merged = store_cost(args.store_rows)
    print(f"store: {per_record * 1e3:.3f} ms per result written (its own committed WAL transaction), "
          f"{per_merged * 1e3:.3f} ms per result merged ({args.store_rows} results)")
    print(f"load average after: {os.getloadavg()[0]:.2f} (was {load:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
