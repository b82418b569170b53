"""``neuron-conformance gate | dashboard | merge | migrate``: what CI does with a build's results.

    gate       regressions of a build against a baseline (exit 1 when there are any)
    dashboard  a static HTML site for a build: coverage, matrices, trends, errors
    merge      shard stores into one results folder (results and artifacts)
    migrate    upgrade a results store to this version's schema, explicitly
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import EXIT_OK, UsageError
from .suite import DEFAULT_RESULTS


def _results_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default=DEFAULT_RESULTS, help=f"results folder (default: {DEFAULT_RESULTS}/)")
    p.add_argument("--verbose", action="store_true", help="show tracebacks")


def _open_existing(results: str):
    from results.store import ResultStore, db_path

    if not db_path(results).exists():
        raise UsageError(f"--results {results}: no results database there ({db_path(results)})")
    return ResultStore.open(results, create=False)


# ---------------------------------------------------------------- gate
def cmd_gate(args) -> int:
    from ci.expectations import ExpectationsError, load_expectations
    from ci.gate import GateOptions, run_gate
    from ci.hooks import Hooks
    from ci.junit import JUnitReporter
    from ci.report import TerminalReporter

    if args.rerun < 0:
        raise UsageError(f"--rerun {args.rerun}: must be 0 or more")
    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: must be at least 1")
    if args.build == args.baseline:
        raise UsageError(f"--build and --baseline are both {args.build!r}: a gate compares two builds")
    expectations = None
    if args.expectations:
        try:
            expectations = load_expectations(args.expectations)
        except ExpectationsError as exc:
            raise UsageError(str(exc)) from None
    if not args.drift_factor > 1:
        raise UsageError(f"--drift-factor {args.drift_factor}: must be greater than 1")
    options = GateOptions(reruns=args.rerun, max_reruns=args.max_reruns, jobs=args.jobs, timeout_s=args.timeout,
                          allow_missing=args.allow_missing, expectations=expectations,
                          drift_factor=args.drift_factor, fail_on_drift=args.fail_on_drift)
    plugins: list[object] = [TerminalReporter()]
    if args.junit:
        plugins.append(JUnitReporter(args.junit))
    with _open_existing(args.results) as store:
        try:
            report = run_gate(store, build=args.build, baseline=args.baseline, options=options, hooks=Hooks(plugins))
        except ExpectationsError as exc:
            raise UsageError(str(exc)) from None
    return report.exit_code


# ---------------------------------------------------------------- dashboard
def cmd_dashboard(args) -> int:
    from report.dashboard import write_dashboard

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; expected a folder for the site")
    with _open_existing(args.results) as store:
        index = write_dashboard(store, build=args.build, baseline=args.baseline, out=out)
    print(f"dashboard: {index} (open it in a browser; the folder is self-contained)")
    return EXIT_OK


# ---------------------------------------------------------------- merge
def cmd_merge(args) -> int:
    from results.store import ResultStore, db_path

    into = Path(args.into)
    sources = [Path(s) for s in args.sources]
    for s in sources:
        if not db_path(s).exists():
            raise UsageError(f"{s}: no results database there ({db_path(s)})")
        if db_path(s).resolve() == db_path(into).resolve():
            raise UsageError(f"{s}: is the destination itself")
    total = 0
    with ResultStore.open(into) as target:
        _check_one_build_each(target, sources, args.build)
        for s in sources:
            with ResultStore.open(s, create=False) as source:
                n = target.merge(source, build_id=args.build)
            print(f"merged {n} results from {db_path(s)}")
            total += n
        builds = [b.id for b in target.builds()]
    print(f"{total} results merged into {db_path(into)}; builds: {', '.join(builds)}")
    return EXIT_OK


def _check_one_build_each(target, sources: list[Path], only: str | None) -> None:
    """Refuses, before anything is copied, to merge results that carry one build id but are not one build
    (another target or backend version, other faults, another selection of cases)."""
    from results.store import ResultStore, db_path
    from runner.suite import same_build

    seen = {b.id: (db_path(target.folder), b.manifest) for b in target.builds() if not only or b.id == only}
    for s in sources:
        with ResultStore.open(s, create=False) as source:
            for b in source.builds():
                if only and b.id != only:
                    continue
                if b.id not in seen:
                    seen[b.id] = (db_path(s), b.manifest)
                    continue
                problem = same_build(seen[b.id][1], b.manifest)
                if problem:
                    raise UsageError(f"{s}: build {b.id} is not the build {b.id} of {seen[b.id][0]} ({problem}); "
                                     "nothing was merged")


# ---------------------------------------------------------------- migrate
def cmd_migrate(args) -> int:
    from results.store import db_path, migrate, schema_version

    before = schema_version(args.results)
    after = migrate(args.results)
    if before == after:
        print(f"{db_path(args.results)}: already at schema version {after}")
    else:
        print(f"{db_path(args.results)}: migrated from schema version {before} to {after}")
    return EXIT_OK


def register(sub) -> None:
    p = sub.add_parser("gate", help="regressions of a build against a baseline (exit 1 when there are any)",
                       description="Compares a build with a baseline in the same results store. Regressions "
                                   "(passed in the baseline, fail now) and baseline-passing cases without a result "
                                   "fail the gate; each regression is rerun in fresh processes to tell flaky from "
                                   "broken, and names its reproducer.")
    p.add_argument("--build", required=True, help="the build to judge")
    p.add_argument("--baseline", required=True, help="the build to compare with (e.g. the last released one)")
    _results_option(p)
    p.add_argument("--expectations", default=None, metavar="FILE", help="TOML file of known failures of this backend")
    p.add_argument("--junit", default=None, metavar="OUT.xml", help="write JUnit XML for the CI system to display")
    p.add_argument("--rerun", type=int, default=2, metavar="K",
                   help="rerun each regression up to K times in fresh processes; a pass makes it flaky (default 2)")
    p.add_argument("--max-reruns", type=int, default=200, metavar="N",
                   help="rerun at most N regressed cases (default 200); the rest count as regressions")
    p.add_argument("-j", "--jobs", type=int, default=1, help="fresh processes at a time for reruns")
    p.add_argument("--timeout", type=float, default=300.0, help="per-rerun timeout in seconds (default 300)")
    p.add_argument("--allow-missing", action="store_true",
                   help="do not fail on baseline-passing cases that have no result in the build")
    p.add_argument("--drift-factor", type=float, default=4.0, metavar="X",
                   help="a passing case whose worst error (ULP against the CPU) grew X times or more is a precision "
                        "drift (default 4: two bits of agreement lost)")
    p.add_argument("--fail-on-drift", action="store_true",
                   help="fail the gate on precision drift too (by default it is reported only)")
    p.set_defaults(func=cmd_gate)

    p = sub.add_parser("dashboard", help="static HTML dashboard of a build",
                       description="Writes a self-contained static site (no network, no server) for a build.")
    p.add_argument("--build", required=True)
    p.add_argument("--baseline", default=None, help="build to show regressions and fixes against")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the site into")
    _results_option(p)
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("merge", help="merge shard results folders into one",
                       description="Copies builds, results, reruns and artifacts of each SOURCE into --into.")
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="results folders (or .sqlite files) to merge")
    p.add_argument("--into", required=True, metavar="DIR", help="results folder to merge into (created if absent)")
    p.add_argument("--build", default=None, help="merge only this build")
    p.add_argument("--verbose", action="store_true", help="show tracebacks")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("migrate", help="upgrade a results store's schema")
    _results_option(p)
    p.set_defaults(func=cmd_migrate)
