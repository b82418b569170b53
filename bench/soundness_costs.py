"""What sound verdicts cost: the host-copy watch, and a fresh compilation per sample.

Runs one slice of op cases (default: 60 ops of op_db, float32, forward and
backward, at most 8 samples each) through the runner three times, with one
worker, on the emulated device under ``exact``:

  1. eager, host-copy watch off  (NEURON_VALIDATE_HOST_COPY_WATCH=0)
  2. eager, host-copy watch on   (the default)
  3. neuron:compile (a fresh dynamo state and one compilation per sample)

and prints wall time, time per sample and the ratios 2/1 and 3/2. With
``--compile-shard N`` it also runs shard 1/N of the whole op sweep under
neuron:compile and projects the full sweep's time from it.

    python bench/soundness_costs.py [--ops N] [--max-samples 8] [--compile-shard 80]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def run(cases, target, env, jobs=1):
    from conformance.settings import RunSettings
    from results.store import ResultStore
    from runner.reporters import StoreWriter
    from runner.suite import run_suite

    with tempfile.TemporaryDirectory() as tmp:
        settings = RunSettings(target=target, timeout_s=600, artifacts_dir=os.path.join(tmp, "artifacts"),
                               env={"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", **env})
        with ResultStore.open(tmp) as store:
            start = time.perf_counter()
            run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id="b", manifest={},
                      target_label=target, jobs=jobs)
            seconds = time.perf_counter() - start
            rows = list(store.results("b"))
    samples = sum(int(r.outcome.evidence.get("samples", 0) or 0) for r in rows)
    statuses: dict[str, int] = {}
    for r in rows:
        statuses[r.outcome.status.value] = statuses.get(r.outcome.status.value, 0) + 1
    return seconds, samples, statuses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=60, help="ops of op_db, every k-th so that kinds mix")
    parser.add_argument("--max-samples", type=int, default=8)
    parser.add_argument("--compile-shard", type=int, default=0, metavar="N",
                        help="also time shard 1/N of the full sweep under neuron:compile, -j 2")
    args = parser.parse_args()

    from op_tests.sources import OpSelection, all_cases, catalogue, op_cases

    names = sorted({entry.name for entry in catalogue().values()})
    step = max(1, len(names) // args.ops)
    chosen = tuple(names[::step][: args.ops])
    cases = op_cases(OpSelection(patterns=chosen, dtypes=("float32",), max_samples=args.max_samples,
                                 hypothesis_examples=0))
    print(f"{len(cases)} cases ({len(chosen)} ops, float32, forward and backward, <= {args.max_samples} samples)")
    off = run(cases, "neuron", {"NEURON_VALIDATE_HOST_COPY_WATCH": "0"})
    on = run(cases, "neuron", {})
    comp = run(cases, "neuron:compile", {})
    for label, (seconds, samples, statuses) in (("eager, watch off", off), ("eager, watch on", on),
                                                ("neuron:compile", comp)):
        print(f"  {label:18s} {seconds:7.1f} s  {samples} samples  {1e3 * seconds / max(samples, 1):6.1f} ms/sample"
              f"  {statuses}")
    print(f"host-copy watch: {on[0] / off[0]:.2f}x the eager slice ({1e3 * (on[0] - off[0]) / max(on[1], 1):.1f} ms "
          f"per sample)")
    print(f"per-sample compilation: {comp[0] / on[0]:.2f}x the eager slice "
          f"({1e3 * (comp[0] - on[0]) / max(comp[1], 1):.0f} ms per sample)")
    if args.compile_shard:
        every = all_cases(OpSelection())
        shard = [c for i, c in enumerate(sorted(every, key=lambda c: c.id)) if i % args.compile_shard == 0]
        seconds, samples, statuses = run(shard, "neuron:compile", {}, jobs=2)
        print(f"neuron:compile, shard 1/{args.compile_shard} of {len(every)} cases: {len(shard)} cases in "
              f"{seconds:.0f} s ({statuses}); projected full sweep {seconds * args.compile_shard / 3600:.1f} h on "
              f"this machine with -j 2")


if __name__ == "__main__":
    main()
