"""Figures of the model-zoo suite on the emulated device.

Prints, for a stratified CI subset (``sample_configs``, every buildable
architecture at least once):
  1. the run with -j N through the harness (worker pool, comparison, results
     store): configurations, wall time, configurations per minute, the time
     split by build, reference, target and comparison, outcomes, and the peak
     resident memory of any worker (sampled every 0.2 s);
  2. the projected wall time of the whole subset (``--sample``, default
     2,000) from the measured rate, when ``--limit`` ran only part of it;
  3. harness overhead: the harness's time per configuration, with one
     worker, against the raw work of the same configurations done in a plain
     loop in one process (build, train on the reference, train on the
     target; no comparison, no subprocess, no store).

  4. ``--noise-floor N``: the base configurations of N timm architectures
     under the default profile (neuron-2.27), judged twice with one worker:
     without a precision model (the golden rule and the determinism rerun
     alone) and with the noise floor; the verdicts per family (pass, within
     precision, mismatch, inconclusive) and the time per case, both ways.

Goals: a CI subset of at least 2,000 configurations within 15 minutes with
-j 2, peak RSS under 4 GiB per worker; a case with the noise floor at most
2x the time of a plain case.

  5. ``--warm``: the same configurations again as a second build would run them, the reference
     outputs from the reference cache the first run filled;
  6. the hours for ``--project`` configurations on ``--nodes`` layouts at the measured rates;
  7. ``--watch-cost N``: only where the target side's time goes on N configurations, in one
     process: the target bare, inside the host-copy watch, and the CPU reference.

    python bench/model_zoo.py [--sample 2000] [--limit 200] [-j 2] [--overhead-configs 20] [--profile exact] [--warm]
    python bench/model_zoo.py --noise-floor 45 [--noise-profile neuron-2.27] [--floor-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class PeakRSS:
    """Samples the resident memory of this process's children (the workers) in a thread."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.peak_mb, self._stop = interval, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.is_set():
            for child in me.children(recursive=True):
                try:
                    self.peak_mb = max(self.peak_mb, child.memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def stratified_part(configs: list, limit: int) -> list:
    """Every k-th configuration, so a partial run keeps the families' mix."""
    if limit <= 0 or limit >= len(configs):
        return configs
    step = len(configs) / limit
    return [configs[int(i * step)] for i in range(limit)]


def harness_run(configs: list, jobs: int, results: str, rss_limit_mb: int, reference_cache: str | None = None,
                build: str | None = None, durations: dict | None = None):
    from model_zoo.execute import model_case
    from conformance.settings import RunSettings, default_threads
    from runner.reporters import OnOutcome, StoreWriter
    from runner.suite import run_suite
    from results.store import ResultStore

    settings = RunSettings(target="neuron", timeout_s=600.0, rss_limit_mb=rss_limit_mb,
                           artifacts_dir=os.path.join(results, "artifacts"), threads=default_threads(jobs),
                           reference_cache=reference_cache)
    cases = [model_case(c) for c in configs]
    totals: dict[str, float] = {}
    findings: list[str] = []

    def collect(case, outcome):
        for k, v in outcome.timings.items():
            totals[k] = totals.get(k, 0.0) + v
        if outcome.status.value not in ("pass", "skip"):
            findings.append(f"{outcome.status.value:<12} {case.title}: {outcome.message[:150]}")

    start = time.perf_counter()
    with PeakRSS() as rss, ResultStore.open(results) as store:
        summary = run_suite(cases, settings=settings, plugins=[StoreWriter(store), OnOutcome(collect)],
                            build_id=build or f"bench-j{jobs}", manifest={}, target_label="neuron", jobs=jobs,
                            durations=durations)
    return time.perf_counter() - start, summary, totals, rss.peak_mb, findings


def raw_loop(configs: list) -> tuple[float, int]:
    """Build, reference and target of each configuration in this process, with nothing around them."""
    import torch

    import emulator
    from model_zoo.execute import run_side
    from model_zoo import build

    emulator.register()
    done, start = 0, time.perf_counter()
    for cfg in configs:
        try:
            built = build(cfg)
            run_side(built, cfg, torch.device("neuron"))
            run_side(built, cfg, torch.device("cpu"), in_place=True)
            done += 1
        except Exception:  # noqa: BLE001 - the harness records these as skips/errors; time them all the same
            pass
    return time.perf_counter() - start, done


def judged(configs: list, results: str, build: str) -> list[tuple]:
    """(title, status, message, seconds) per configuration, one worker."""
    from model_zoo.execute import model_case
    from conformance.settings import RunSettings, default_threads
    from runner.reporters import OnOutcome, StoreWriter
    from runner.suite import run_suite
    from results.store import ResultStore

    rows: list[tuple] = []
    settings = RunSettings(target="neuron", timeout_s=900.0, artifacts_dir=os.path.join(results, "artifacts"),
                           threads=default_threads(1))
    with ResultStore.open(results) as store:
        run_suite([model_case(c) for c in configs], settings=settings, build_id=build, manifest={}, jobs=1,
                  target_label="neuron", plugins=[StoreWriter(store), OnOutcome(
                      lambda case, o: rows.append((case.title, o.status.value, o.message, o.duration_s)))])
    return rows


def noise_floor_cost(n: int, profile: str, tmp: str, *, floor_only: bool = False) -> None:
    import json

    import model_zoo
    from report.coverage import WITHIN_PRECISION

    os.environ["NEURON_VALIDATE_EMULATOR_PROFILE"] = profile
    base = model_zoo.base_configs(families=["timm"])
    configs = stratified_part(base, n)
    empty = Path(tmp) / "no_precision_model.json"
    empty.write_text(json.dumps({"name": "none", "ops": []}))
    os.environ["NEURON_VALIDATE_PRECISION_MODEL"] = str(empty)
    plain = {} if floor_only else {r[0]: r for r in judged(configs, os.path.join(tmp, "plain"), "plain")}
    del os.environ["NEURON_VALIDATE_PRECISION_MODEL"]
    floor = {r[0]: r for r in judged(configs, os.path.join(tmp, "floor"), "floor")}

    def verdict(row):
        return "within precision" if row[1] == "pass" and WITHIN_PRECISION in row[2] else row[1]

    print(f"\n4. noise floor on the base configurations of {len(configs)} timm architectures, profile {profile}, -j 1")
    for name, rows in (("without the noise floor", plain), ("with the noise floor", floor)):
        counts: dict[str, int] = {}
        for r in rows.values():
            counts[verdict(r)] = counts.get(verdict(r), 0) + 1
        print(f"   {name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    formed = [t for t in floor if "device precision" in floor[t][2] or floor[t][1] == "inconclusive"]
    print(f"   time of all {len(floor)} cases with the noise floor: {sum(r[3] for r in floor.values()):.0f} s")
    if formed and plain:
        ratio = sum(floor[t][3] for t in formed) / sum(plain[t][3] for t in formed)
        print(f"   time of the {len(formed)} cases that formed a noise floor: {ratio:.2f}x the same cases without it "
              f"(goal <= 2x); all cases: {sum(r[3] for r in floor.values()) / sum(r[3] for r in plain.values()):.2f}x")
    for t in sorted(floor):
        if verdict(floor[t]) != "pass":
            before = verdict(plain[t]) if t in plain else "-"
            print(f"     {before:<16} -> {verdict(floor[t]):<16} {t}: {floor[t][2][:400]}")


def watch_cost(configs: list) -> None:
    """Where a configuration's target side goes, in this process with one thread: the target run bare, the same
    run inside the host-copy watch (the execution trace recorded, then read), and the CPU reference."""
    import torch

    import emulator
    from model_zoo import build
    from model_zoo.execute import run_side
    from conformance.host_copies import watch_host_copies

    emulator.register()
    torch.set_num_threads(1)
    device = torch.device("neuron")
    totals = {"target bare": 0.0, "target watched": 0.0, "reference": 0.0}
    worst: list[tuple[float, float, str]] = []
    ran = 0
    for cfg in configs:
        try:
            built = build(cfg)
            run_side(built, cfg, device)  # first use of the model's classes and kernels is not the figure
            t0 = time.perf_counter()
            run_side(built, cfg, device)
            t1 = time.perf_counter()
            with watch_host_copies(True):
                run_side(built, cfg, device)
            t2 = time.perf_counter()
            run_side(built, cfg, torch.device("cpu"))
            t3 = time.perf_counter()
        except Exception:  # noqa: BLE001 - the harness records these as skips/errors
            continue
        ran += 1
        totals["target bare"] += t1 - t0
        totals["target watched"] += t2 - t1
        totals["reference"] += t3 - t2
        worst.append((t2 - t1, t1 - t0, cfg.arch))
    print(f"\n7. target side, {ran} configurations in one process, one thread (mean per configuration): "
          + ", ".join(f"{k} {v / max(1, ran):.3f} s" for k, v in totals.items()))
    for watched, bare, arch in sorted(worst, reverse=True)[:3]:
        print(f"   slowest watched: {arch}: {watched:.2f} s watched, {bare:.2f} s bare")


def project(total: int, per_core: float, warm_per_core: float | None, layouts: str) -> None:
    """Hours for ``total`` configurations on N nodes of M cores at the measured configurations per core-minute
    (one worker per core, as bench/scale.py measures the scale-out), cold and with a warm reference."""
    print(f"\n6. projection: {total:,} configurations of this mix at {per_core:.1f} configurations per core-minute"
          + (f" ({warm_per_core:.1f} with a warm reference)" if warm_per_core else "")
          + "; one worker per core, linear in cores")
    for layout in layouts.split(","):
        nodes, cores = (int(x) for x in layout.split("x"))
        hours = total / (per_core * nodes * cores) / 60
        warm = f", warm reference {total / (warm_per_core * nodes * cores) / 60:6.1f} h" if warm_per_core else ""
        print(f"   {nodes:>3} nodes x {cores:>3} cores: cold {hours:6.1f} h{warm}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=2000, help="size of the stratified CI subset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="run only this many of the subset (0: all)")
    parser.add_argument("--family", default="", help="comma-separated families (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--overhead-configs", type=int, default=20, help="configs timed raw vs harness (0: skip)")
    parser.add_argument("--profile", default="exact")
    parser.add_argument("--watch-cost", type=int, default=0, metavar="N",
                        help="only the target side's cost, bare and inside the host-copy watch, on N configurations")
    parser.add_argument("--project", type=int, default=200_000, help="project this many configurations (0: no)")
    parser.add_argument("--nodes", default="1x2,4x32,8x32,16x32,32x32", help="NODESxCORES layouts to project")
    parser.add_argument("--warm", action="store_true",
                        help="with a reference cache, and run the configurations again from it (a second build)")
    parser.add_argument("--rss-limit-mb", type=int, default=4096)
    parser.add_argument("--keep", default="", metavar="DIR",
                        help="keep the run's results store and artifacts in DIR (default: a temporary folder)")
    parser.add_argument("--noise-floor", type=int, default=0, metavar="N",
                        help="only the noise-floor figures, on N timm architectures")
    parser.add_argument("--noise-profile", default="neuron-2.27")
    parser.add_argument("--floor-only", action="store_true",
                        help="with --noise-floor: only the run with the noise floor (not the one without a precision model)")
    args = parser.parse_args()
    if args.noise_floor:
        with tempfile.TemporaryDirectory(prefix="bench_noise_") as tmp:
            noise_floor_cost(args.noise_floor, args.noise_profile, tmp, floor_only=args.floor_only)
        return

    os.environ["NEURON_VALIDATE_EMULATOR_PROFILE"] = args.profile
    import model_zoo

    families = [f for f in args.family.split(",") if f] or None
    subset = model_zoo.sample_configs(args.sample, args.seed, families)
    archs = {model_zoo.get_entry(c.arch).architecture for c in subset}
    part = stratified_part(subset, args.limit)
    if args.watch_cost:
        watch_cost(stratified_part(part, args.watch_cost))
        return
    print(f"CI subset: {len(subset)} configurations over {len(archs)} architectures "
          f"(--sample {args.sample} --seed {args.seed}); running {len(part)} with -j {args.jobs}, "
          f"profile {args.profile}, {os.cpu_count()} CPUs", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench_zoo_") as scratch:
        tmp = args.keep or scratch
        cache = os.path.join(tmp, "reference_cache.sqlite") if args.warm else None
        wall, summary, totals, peak, findings = harness_run(part, args.jobs, os.path.join(tmp, "run"), args.rss_limit_mb,
                                                            cache, "cold")
        rate = len(part) / wall * 60
        print(f"\n1. harness, -j {args.jobs}: {len(part)} configurations in {wall:.1f} s = {rate:.1f} configurations/min"
              f" = {rate / args.jobs:.1f} per core-minute")
        print("   time per configuration (summed over workers): "
              + ", ".join(f"{k} {v / max(1, len(part)):.2f} s" for k, v in sorted(totals.items())))
        print(f"   wall time x workers / the cases' own time: {wall * args.jobs / summary.case_seconds:.2f} "
              f"(goal <= 1.2); load average at the end {os.getloadavg()[0]:.1f} (other processes share the cores)")
        print(f"   {summary.starts_line}")
        print("   outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())))
        for line in findings[:30]:
            print(f"     {line}")
        print(f"   peak worker RSS: {peak:.0f} MiB (cap {args.rss_limit_mb} MiB)")
        projected = len(subset) / rate
        print(f"\n2. whole subset ({len(subset)} configurations) at that rate: {projected:.1f} min "
              f"(goal: 15 min with -j 2)")
        warm_rate = None
        if args.warm:  # the same configurations again, as the next backend build: the reference from the cache
            from results.store import ResultStore
            from runner.suite import previous_durations

            with ResultStore.open(os.path.join(tmp, "run")) as store:
                durations = previous_durations(store, "warm")  # a nightly starts with the longest cases
            warm_wall, warm, warm_totals, _, _ = harness_run(part, args.jobs, os.path.join(tmp, "run"),
                                                             args.rss_limit_mb, cache, "warm", durations)
            warm_rate = len(part) / warm_wall * 60
            print(f"\n   warm reference (a second build, same configurations, longest first): {warm_wall:.1f} s = "
                  f"{warm_rate:.1f} configurations/min; wall x workers / own time "
                  f"{warm_wall * args.jobs / warm.case_seconds:.2f}; time per configuration: "
                  + ", ".join(f"{k} {v / max(1, len(part)):.2f} s" for k, v in sorted(warm_totals.items()))
                  + f"; whole subset projected {len(subset) / warm_rate:.1f} min (goal: 10 min with -j 2); load "
                  f"average at the end {os.getloadavg()[0]:.1f}")
        if args.project:
            project(args.project, rate / args.jobs, warm_rate / args.jobs if warm_rate else None, args.nodes)

        if args.overhead_configs:
            few = stratified_part(part, args.overhead_configs)
            raw, ran = raw_loop(few)
            harness, *_ = harness_run(few, 1, os.path.join(tmp, "overhead"), args.rss_limit_mb)
            print(f"\n3. overhead on {len(few)} configurations ({ran} ran raw): raw loop {raw:.1f} s, "
                  f"harness -j 1 {harness:.1f} s: {harness / raw:.2f}x (includes worker start-up)")


if __name__ == "__main__":
    main()
