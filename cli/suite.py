"""Running a list of cases as a suite: the options every suite command shares, the run, the summary.

``neuron-conformance ops | models | scripts | distributed`` differ only in how
they select their cases; from there each hands them to ``run_cases``, which
opens the store, attaches the reporters, runs the suite and prints the summary
and the failure groups. It lives apart from ``conformance.py`` (the entry
point, which imports every command module) so that the command modules import
it without importing their own entry point back.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .common import EXIT_FINDINGS, EXIT_OK, UsageError, add_target_options, resolve_targets

if TYPE_CHECKING:
    from conformance.target import Target

DEFAULT_RESULTS = "runs"
SELECTION_KEY = "selection"  # the build manifest's record of the cases selected (see selection())


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
    g.add_argument("--device-resource", default=None, metavar="NAME",
                   help="Ray resource each worker takes one of, one device per actor (default: neuron_cores for a "
                        "real Neuron target or where the cluster offers them; GPU for cuda)")
    g.add_argument("--no-reference-cache", action="store_true", help="do not reuse cached reference results")
    g.add_argument("--reference-cache", default=None, metavar="FILE",
                   help="the reference cache's SQLite file, on a local disk of every node that runs workers "
                        "(default: reference_cache.sqlite in the results folder)")
    g.add_argument("--jsonl", default=None, metavar="FILE", help="also append one JSON line per outcome to FILE")
    g.add_argument("--junit", default=None, metavar="OUT.xml", help="also write JUnit XML of the cases run")


def _settings(args, *, timeout: float, build: str, warmup: tuple[str, ...] = (), target=None):
    from conformance.settings import RunSettings, default_threads

    results = Path(args.results)
    device_resource = getattr(args, "device_resource", None)
    if device_resource is None and args.executor == "ray" and target is not None:
        # A real device needs one per actor: a cluster without it is refused, not run on its CPUs.
        device_resource = {"neuron": "neuron_cores", "cuda": "GPU"}.get(target.kind)
    return RunSettings(
        target=args.target,
        reference=args.reference,
        backend_modules=tuple(args.backend_module),
        timeout_s=args.timeout or timeout,
        rss_limit_mb=args.rss_limit_mb,
        artifacts_dir=str(results / "artifacts" / build),  # one folder per build: builds never overwrite each other
        reference_cache=None if args.no_reference_cache else (args.reference_cache
                                                              or str(results / "reference_cache.sqlite")),
        warmup=warmup,
        threads=default_threads(args.jobs),
        device_resource=device_resource,
    )


@dataclass(frozen=True)
class RunPlan:
    """The run's own options, checked: the targets resolved and the shard parsed."""

    reference: Target
    target: Target
    shard: tuple[int, int] | None = None  # (i, N): shard i of N


def plan_run(args) -> RunPlan:
    """Checks the options every suite run shares (workers, results folder, report files, shard, target and
    reference) before a command selects its cases: a mistyped ``--target`` is one line at once, not after the
    selection has loaded OpInfo's database (10 s)."""
    from conformance.case import parse_shard

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
    return RunPlan(reference=reference, target=target, shard=shard_spec)


def run_cases(args, plan: RunPlan, cases, *, kind_label: str, timeout: float, group: str = "dtype",
              warmup: tuple[str, ...] = ()) -> int:
    """Runs the cases as one build; the summary table counts outcomes per dtype, or (any other ``group``: the
    column's heading, e.g. ``family`` for models) per case category."""
    from results.store import ResultStore
    from runner.reporters import JsonLinesWriter, JUnitWriter, ProgressReporter, StoreWriter
    from runner.suite import default_build_id, previous_durations, run_suite

    from .progress import console, summary_table

    reference, target, shard_spec = plan.reference, plan.target, plan.shard
    build = args.build or default_build_id(target.label)
    settings = _settings(args, timeout=timeout, build=build, warmup=warmup, target=target)
    manifest = target.manifest()
    manifest["reference"] = reference.manifest()
    manifest[SELECTION_KEY] = selection(kind_label, cases)
    with ResultStore.open(args.results) as store:
        if args.resume:
            check_same_selection(store, build, manifest)
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
            address=args.address, durations=previous_durations(store, build),
        )
        failure_lines = _failure_groups(store, build)
    if summary.skipped_resume:
        console.print(f"resumed: {summary.skipped_resume} cases already had results")
    groups = summary.by_dtype if group == "dtype" else summary.by_category
    console.print(summary_table(f"{kind_label}: {target.describe()} (build {build})", summary.counts, groups, group))
    for line in failure_lines:
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"{summary.ran} cases ran in {summary.seconds:.1f} s{summary.overhead_note(args.jobs)}; "
                  f"target: {target.describe()}")
    if set(summary.worker_starts) - {"pool"}:  # workers replaced during the run: part of what it cost
        console.print(summary.starts_line, markup=False, soft_wrap=True)
    return EXIT_FINDINGS if summary.failures else EXIT_OK


def selection(kind_label: str, cases) -> dict:
    """What a run selected, before sharding: every shard and every resumed run of one build selects the same
    cases, so merge and --resume can tell shards of one build from another build's, and the dashboard can say
    how much of the selection the build holds."""
    from runner.suite import selection_digest

    kinds = sorted({c.kind for c in cases})
    return {"command": kind_label, "kind": kinds[0] if len(kinds) == 1 else None, "cases": len(cases),
            "digest": selection_digest(c.id for c in cases)}


def check_same_selection(store, build: str, manifest: dict) -> None:
    """--resume into a build started with other cases or another target would mix two runs in one build."""
    from results.store import StoreError
    from runner.suite import same_build

    try:
        stored = store.build(build)
    except StoreError:
        return  # nothing stored yet: a first run
    problem = same_build(stored.manifest, manifest)
    if problem:
        raise UsageError(f"--resume --build {build}: this run is not the stored build's ({problem})")


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
