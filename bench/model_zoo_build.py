"""Times zoo builds and one training step per architecture; prints figures per family.

    python bench/model_zoo_build.py [--sample 200] [--seed 0] [--pattern 'timm/*'] [--compare-status]

Each config is built and trained in this process, one after another, as a CI
worker would; the figures estimate how long a stratified CI subset takes
(``--estimate N WORKERS``). With ``--compare-status`` it also prints the
survey's recorded seconds for the same architectures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_zoo import ModelBuildError, build, get_entry, load_status, sample_configs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pattern", action="append", default=None)
    parser.add_argument("--estimate", nargs=2, type=int, metavar=("N", "WORKERS"), default=(2000, 2))
    args = parser.parse_args(argv)
    configs = sample_configs(0, args.seed, patterns=args.pattern, where={"execution": ["eager"]})
    step = max(1, len(configs) // max(1, args.sample))
    configs = configs[::step][: args.sample]
    times: dict[str, list[float]] = defaultdict(list)
    failures = 0
    for cfg in configs:
        start = time.perf_counter()
        try:
            built = build(cfg)
            out = built.model(**built.inputs)
            loss = built.loss_fn(out, built.inputs)
            if cfg.mode != "eval":
                loss.backward()
        except (ModelBuildError, RuntimeError, ValueError, TypeError) as exc:
            failures += 1
            print(f"  fail {cfg.arch}: {str(exc)[:100]}", file=sys.stderr)
            continue
        times[get_entry(cfg.arch).family].append(time.perf_counter() - start)
    all_times = [t for ts in times.values() for t in ts]
    print(f"{len(all_times)} built and trained, {failures} failed")
    for family, ts in sorted(times.items()):
        print(f"  {family:<10} n={len(ts):<4} mean {statistics.mean(ts):.2f}s  median {statistics.median(ts):.2f}s  "
              f"max {max(ts):.1f}s")
    if all_times:
        n, workers = args.estimate
        mean = statistics.mean(all_times)
        print(f"estimate: {n} configs x 2 sides x {mean:.2f}s / {workers} workers = {n * 2 * mean / workers / 60:.1f} min")
    status = load_status()
    recorded = [r.get("build_s", 0) + r.get("run_s", 0) for r in status.values() if r.get("status") == "ok"]
    if recorded:
        print(f"survey: {len(recorded)} passing entries, mean build+step {statistics.mean(recorded):.2f}s, "
              f"total {sum(recorded) / 60:.0f} min one side")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
