"""Scale-out: the speedup of 2 workers over 1, for the local process pool and for Ray, and the
cost per case of writing results to the store.

    .venv/bin/python bench/scale.py [--ops GLOBS] [--dtypes LIST] [--jobs 2] [--no-ray] [--store-rows N]
    .venv/bin/python bench/scale.py --models 60 [--cluster]

``--models N`` times N configurations of the model zoo's CI subset instead
of op cases; ``--cluster`` adds a simulated 3-node Ray cluster
(``ray.cluster_utils.Cluster`` on 127.0.0.1: a head with no CPUs, the driver's
node, and two worker nodes with one CPU each, one actor per node).

Each executor runs the same case set twice on the same workers (the
emulated device, exact profile, no reference cache, so both passes do the
same work), writing every result to a store as the suite does:

- cold: the first pass, from starting the workers to the last result, what
  a short sweep sees; a worker's start (importing torch and the op database,
  a few seconds) is paid once per worker and keeps a short sweep from the
  ideal speedup;
- warm: the second pass, on workers already started, what a long sweep
  sees for almost all of its cases: the scale-out itself.

Workers run one torch thread each (OMP_NUM_THREADS=1), one per core, as on
a cluster node. Ray's own start (``ray.init``) is outside the timing: a
cluster is up before a sweep begins. Each figure is the best of --repeat
runs. Other processes on the machine change every figure, so each line
also says how many cores the harness (this process and all its
descendants) actually got during the warm pass: 2 workers on a machine
where others hold one of the two cores cannot beat 1 worker.
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


def model_cases(n: int):
    """``n`` configurations of the zoo's CI subset (every k-th, so the families' mix is kept)."""
    import model_zoo
    from model_zoo.execute import model_case

    subset = model_zoo.sample_configs(2000, 0)
    step = len(subset) / n
    return [model_case(subset[int(i * step)]) for i in range(min(n, len(subset)))]


def loopback_cluster(worker_nodes: int):
    """A simulated multi-node Ray cluster on 127.0.0.1: a head with no CPUs and ``worker_nodes`` nodes of one CPU."""
    from runner.transports import LOOPBACK, loopback_env, ray_init

    loopback_env()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK,
                                                            "include_dashboard": False})
    for _ in range(worker_nodes):
        cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    ray_init(cluster.address)
    return cluster


def settings(artifacts: Path):
    from conformance.settings import RunSettings

    return RunSettings(target="neuron", timeout_s=600, artifacts_dir=str(artifacts),
                       env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": "",
                            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


def tree_cpu() -> dict[int, float]:
    """CPU seconds so far of this process and all its descendants (pool workers; a local Ray's processes)."""
    import psutil

    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


def timed_passes(selected, *, executor: str, jobs: int) -> tuple[float, float, dict]:
    """(cold seconds, warm seconds, cores used in the warm pass, outcome counts) of two passes over the
    case set on the same workers."""
    from results.store import ResultStore
    from runner.supervisor import Supervisor

    with tempfile.TemporaryDirectory() as tmp:
        run_settings = settings(Path(tmp) / "artifacts")
        runner = Supervisor(run_settings, jobs=jobs, transport=executor, persistent=True)
        by_id = {c.id: c for c in selected}
        times, counts, cores = [], {}, 0.0
        try:
            with ResultStore.open(tmp) as store:
                store.ensure_build("bench", target="neuron", label="neuron (emulated)", manifest={})
                for _ in range(2):
                    start, cpu = time.perf_counter(), tree_cpu()
                    for outcome in runner.run(selected):
                        store.record("bench", by_id[outcome.case_id], outcome)
                        counts[outcome.status.value] = counts.get(outcome.status.value, 0) + 1
                    times.append(time.perf_counter() - start)
                    cores = cpu_delta(cpu, tree_cpu()) / times[-1]
                assert len(store.completed("bench")) == len(selected)
        finally:
            runner.close()
    return times[0], times[1], cores, {k: v // 2 for k, v in counts.items()}


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
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--store-rows", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per figure")
    parser.add_argument("--models", type=int, default=0, metavar="N", help="N zoo configurations instead of op cases")
    parser.add_argument("--cluster", action="store_true", help="also a simulated 3-node Ray cluster on 127.0.0.1")
    args = parser.parse_args()

    os.environ.setdefault("NEURON_VALIDATE_EMULATOR_PROFILE", "exact")
    selected = model_cases(args.models) if args.models else cases(args.ops, args.dtypes)
    what = "model configurations (CI subset)" if args.models else f"op cases ({args.dtypes}, forward and backward)"
    load = os.getloadavg()[0]
    print(f"case set: {len(selected)} {what}; {os.cpu_count()} cores; "
          f"one torch thread per worker; load average {load:.2f}", flush=True)

    executors = ["local"] + ([] if args.no_ray else ["ray"]) + (["cluster"] if args.cluster else [])
    for executor in executors:
        cluster = None
        if executor == "ray":
            from runner.transports import ray_init

            ray = ray_init(num_cpus=args.jobs)  # a private instance on 127.0.0.1
        elif executor == "cluster":
            import ray

            cluster = loopback_cluster(args.jobs)
        label = {"local": "local pool", "ray": "ray", "cluster": "3-node ray"}[executor]
        figures: dict[int, tuple[float, float]] = {}
        for jobs in ((args.jobs,) if cluster else (1, args.jobs)):
            runs = [timed_passes(selected, executor="ray" if cluster else executor, jobs=jobs)
                    for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r[1])
            cold, warm = min(r[0] for r in runs), best[1]
            figures[jobs] = (cold, warm, best[2])
            print(f"{label:<10} {jobs} worker{'s' if jobs > 1 else ' '}: cold {cold:6.1f} s, warm {warm:6.1f} s "
                  f"({warm / len(selected) * 1e3:5.0f} ms per case warm; the harness got {best[2]:.2f} cores; "
                  f"{', '.join(f'{k} {v}' for k, v in sorted(best[3].items()))}; "
                  f"load average {os.getloadavg()[0]:.1f})", flush=True)
        if cluster is not None:
            ray.shutdown()
            cluster.shutdown()
            (c1, w1, _), (cn, wn, _) = local_one, figures[args.jobs]
            print(f"{label:<10} speedup of {args.jobs} actors on {args.jobs} nodes over 1 local worker: "
                  f"{w1 / wn:.2f}x warm, {c1 / cn:.2f}x cold", flush=True)
            continue
        if executor == "local":
            local_one = figures[1]
        (c1, w1, k1), (cn, wn, kn) = figures[1], figures[args.jobs]
        print(f"{label:<10} speedup of {args.jobs} workers over 1: {w1 / wn:.2f}x warm, {c1 / cn:.2f}x cold "
              f"(goal {0.9 * args.jobs:.1f}x); CPU per case warm: {w1 * k1 / len(selected) * 1e3:.0f} ms with 1 "
              f"worker, {wn * kn / len(selected) * 1e3:.0f} ms with {args.jobs} (equal: no serial cost; the "
              f"speedup is what the free cores allow)", flush=True)
        if executor == "ray":
            ray.shutdown()

    per_record, per_merged = store_cost(args.store_rows)
    print(f"store: {per_record * 1e3:.3f} ms per result written (its own committed WAL transaction), "
          f"{per_merged * 1e3:.3f} ms per result merged ({args.store_rows} results)")
    print(f"load average after: {os.getloadavg()[0]:.2f} (was {load:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
