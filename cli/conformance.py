"""``neuron-conformance``: suites, gates, dashboards and loss-curve demos.

    neuron-conformance ops      operator conformance (OpInfo x dtypes x forward/backward)
    neuron-conformance models   the model zoo
    neuron-conformance scripts  a folder of user scripts, each checked as neuron-validate checks it
    neuron-conformance gate     regressions of one build against a baseline
    neuron-conformance dashboard  static HTML dashboard of a build
    neuron-conformance curves   side-by-side loss curves of a zoo model
    neuron-conformance merge    merge shard stores into one
    neuron-conformance migrate  upgrade a results store's schema
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import (
    EXIT_FINDINGS,
    EXIT_OK,
    OneLineParser,
    UsageError,
    add_target_options,
    apply_environment,
    resolve_targets,
    run_command,
)

PROG = "neuron-conformance"
DEFAULT_RESULTS = "runs"


def add_suite_options(p: argparse.ArgumentParser) -> None:
    add_target_options(p)
    g = p.add_argument_group("run")
    g.add_argument("--build", default=None, help="build id to record results under (default: derived from target and time)")
    g.add_argument("--results", default=DEFAULT_RESULTS, help=f"results folder (default: {DEFAULT_RESULTS}/)")
    g.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    g.add_argument("--shard", default=None, metavar="i/N", help="run shard i of N (by case id)")
    g.add_argument("--resume", action="store_true", help="skip cases this build already has results for")
    g.add_argument("--timeout", type=float, default=None, help="per-case timeout in seconds")
    g.add_argument("--rss-limit-mb", type=int, default=4096, help="stop a worker above this RSS (default 4096)")
    g.add_argument("--executor", choices=("local", "ray"), default="local")
    g.add_argument("--address", default=None, help="Ray cluster address (with --executor ray)")
    g.add_argument("--no-reference-cache", action="store_true", help="do not reuse cached reference results")
    g.add_argument("--jsonl", default=None, metavar="FILE", help="also append one JSON line per outcome to FILE")
    g.add_argument("--junit", default=None, metavar="OUT.xml", help="also write JUnit XML of the cases run")


def _settings(args, *, timeout: float, build: str, warmup: tuple[str, ...] = ()):
    from conformance.settings import RunSettings, default_threads

    results = Path(args.results)
    return RunSettings(
        target=args.target,
        reference=args.reference,
        backend_modules=tuple(args.backend_module),
        timeout_s=args.timeout or timeout,
        rss_limit_mb=args.rss_limit_mb,
        artifacts_dir=str(results / "artifacts" / build),  # one folder per build: builds never overwrite each other
        reference_cache=None if args.no_reference_cache else str(results / "reference_cache.sqlite"),
        warmup=warmup,
        threads=default_threads(args.jobs),
    )


def _run(args, cases, *, kind_label: str, timeout: float, group: str = "dtype", warmup: tuple[str, ...] = ()) -> int:
    from conformance.case import parse_shard
    from results.store import ResultStore
    from runner.reporters import JsonLinesWriter, JUnitWriter, ProgressReporter, StoreWriter
    from runner.suite import default_build_id, run_suite

    from .progress import console, summary_table

    if args.jobs < 1:
        raise UsageError(f"-j {args.jobs}: must be at least 1")
    if Path(args.results).exists() and not Path(args.results).is_dir():
        raise UsageError(f"--results {args.results}: is a file; expected a results folder")
    for option, value in (("--jsonl", args.jsonl), ("--junit", args.junit)):
        if value and Path(value).is_dir():
            raise UsageError(f"{option} {value}: is a folder; expected a file")
    shard_spec = None
    if args.shard:
        try:
            shard_spec = parse_shard(args.shard)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    reference, target = resolve_targets(args)
    build = args.build or default_build_id(target.label)
    settings = _settings(args, timeout=timeout, build=build, warmup=warmup)
    manifest = target.manifest()
    manifest["reference"] = reference.manifest()
    with ResultStore.open(args.results) as store:
        console.print(f"[bold]{kind_label}[/] on [bold]{target.describe()}[/] against {reference.describe()}; "
                      f"build [bold]{build}[/], {len(cases)} cases, results in {store.path}")
        plugins: list[object] = [StoreWriter(store), ProgressReporter(kind_label, console)]
        if args.jsonl:
            plugins.append(JsonLinesWriter(args.jsonl))
        if args.junit:
            plugins.append(JUnitWriter(args.junit))
        done = {r.case_id: r.status for r in store.statuses(build)} if args.resume else None
        summary = run_suite(
            cases, settings=settings, build_id=build, manifest=manifest, target_label=target.label,
            plugins=plugins, jobs=args.jobs, shard_spec=shard_spec, done=done, executor=args.executor,
            address=args.address,
        )
        failure_lines = _failure_groups(store, build)
    if summary.skipped_resume:
        console.print(f"resumed: {summary.skipped_resume} cases already had results")
    groups = summary.by_family if group == "family" else summary.by_dtype
    console.print(summary_table(f"{kind_label}: {target.describe()} (build {build})", summary.counts, groups, group))
    for line in failure_lines:
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"{summary.ran} cases ran in {summary.seconds:.1f} s; target: {target.describe()}")
    return EXIT_FINDINGS if summary.failures else EXIT_OK


MAX_GROUPS_SHOWN = 20


def _failure_groups(store, build: str) -> list[str]:
    """The build's failures grouped by op and cause (results/groups.py), one headline each."""
    from conformance.outcome import FAILING
    from results.groups import failures_from_rows, group_failures

    failures = failures_from_rows(store.results(build, statuses=FAILING))
    if not failures:
        return []
    groups = group_failures(failures)
    lines = [f"{len(failures)} failing cases in {len(groups)} groups (by op and by what the failing inputs share):"]
    for g in groups[:MAX_GROUPS_SHOWN]:
        lines.append(f"  {g.headline}")
        if g.repro:
            lines.append(f"      reproducer: python {store.artifact(g.repro)}")
    if len(groups) > MAX_GROUPS_SHOWN:
        lines.append(f"  ... and {len(groups) - MAX_GROUPS_SHOWN} more groups (neuron-conformance dashboard shows all)")
    return lines


# ---------------------------------------------------------------- ops
def cmd_ops(args) -> int:
    apply_environment(args)
    from op_tests.families import FAMILIES
    from op_tests.sources import DIRECTIONS, OpSelection, UnknownOpError, all_cases

    directions = tuple(d.strip() for d in args.directions.split(",") if d.strip())
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    families = FAMILIES if families == ("all",) else () if families == ("none",) else families
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip()) if args.dtypes else ()
    try:
        cases = all_cases(OpSelection(
            patterns=tuple(p.strip() for p in args.ops.split(",") if p.strip()) or ("*",),
            exclude=tuple(p.strip() for p in (args.exclude or "").split(",") if p.strip()),
            dtypes=dtypes, directions=directions or DIRECTIONS, max_samples=args.max_samples, seed=args.seed,
            hypothesis_examples=args.hypothesis_examples, families=families,
        ))
    except (UnknownOpError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if not cases:
        raise UsageError("the selection holds no cases (check --ops, --dtypes and --directions)")
    if args.list:
        for c in cases:
            print(c.id, c.title)
        return EXIT_OK
    return _run(args, cases, kind_label="ops", timeout=300.0, warmup=("op",))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    p = sub.add_parser("ops", help="operator conformance suite")
    add_suite_options(p)
    p.add_argument("--ops", default="*", help="comma-separated globs over OpInfo names (name or name.variant)")
    p.add_argument("--exclude", default="", help="comma-separated globs to leave out")
    p.add_argument("--dtypes", default="", help="comma-separated dtypes (default: all the op supports)")
    p.add_argument("--directions", default="forward,backward", help="forward, backward or both")
    p.add_argument("--max-samples", type=int, default=0, help="at most this many samples per case (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hypothesis-examples", type=int, default=16,
                   help="hypothesis examples per element-wise op x float dtype x direction (0: none)")
    p.add_argument("--families", default="all", metavar="NAME,...",
                   help="input families that hunt accelerator bugs: sizes, extremes, mixed, layouts, variants; "
                        "'all' (default) or 'none'")
    p.add_argument("--list", action="store_true", help="print the selected cases and exit")
    p.set_defaults(func=cmd_ops)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


# Modules that add subcommands: each has register(subparsers).
COMMAND_MODULES: tuple[str, ...] = ("commands_ci", "commands_models", "commands_curves", "commands_scripts",
                                    "commands_distributed")
_EXTRA_COMMANDS: list = []


def main(argv: list[str] | None = None) -> int:
    import importlib

    _EXTRA_COMMANDS[:] = [importlib.import_module(f"{__package__}.{m}").register for m in COMMAND_MODULES]
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_command(PROG, args.func, args)


if __name__ == "__main__":
    sys.exit(main())
