"""The gate: did anything that used to work stop working in this build?

    compare the build with its baseline        (ci.baseline: one verdict per case)
    -> known failures become xfail / xpass     (ci.expectations)
    -> each regression is rerun up to K times  (runner.supervisor, fresh=True: a process each;
       in fresh processes; one pass: flaky      the first pass ends a case's reruns)
    -> every regression gets a reproducer      (written by a process that saw it fail)
    -> reporters are told through hooks        (ci.hooks: terminal lines, JUnit XML)

The gate fails (exit 1) on regressions, and on cases that passed in the
baseline but have no result in the build (a lost shard must not pass the
gate); ``allow_missing`` accepts the latter when the case set changed on
purpose. Precision drift (ci.drift: passing cases whose worst error grew 4x
or more) is always reported, and fails the gate only with ``fail_on_drift``.
Everything else (fixes, flaky cases, xpass, failures the baseline had too,
new cases that fail) is reported and does not fail the gate.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from conformance.outcome import Status
from runner.supervisor import Job, Supervisor, TransportError

from .baseline import BuildComparison, CaseChange, Verdict, compare_builds
from .drift import DEFAULT_FACTOR, DriftReport, precision_drift
from .expectations import Expectations
from .hooks import Hooks
from .reruns import settings_for_build, slug


@dataclass(frozen=True, slots=True, kw_only=True)
class GateOptions:
    reruns: int = 0  # K: reruns of each regression in fresh processes
    max_reruns: int = 200  # rerun at most this many regressions (a broken build has thousands)
    jobs: int = 1  # fresh processes at a time
    timeout_s: float = 300.0  # per rerun
    allow_missing: bool = False
    expectations: Expectations | None = None
    write_repros: bool = True  # reruns write reproducers regardless; this adds them where every run crashed
    drift_factor: float = DEFAULT_FACTOR  # a passing case whose worst error grew this much is a drift
    fail_on_drift: bool = False

    def __post_init__(self) -> None:
        if not self.drift_factor > 1:
            raise ValueError(f"drift_factor={self.drift_factor!r} (type=float): must be greater than 1")
        for name in ("reruns", "max_reruns"):
            value = getattr(self, name)
            if value < 0:
                raise ValueError(f"{name}={value!r} (type=int): must be >= 0")
        if self.jobs < 1:
            raise ValueError(f"jobs={self.jobs!r} (type=int): must be >= 1")


@dataclass(slots=True, kw_only=True)
class GateReport:
    build: object  # results.store.BuildInfo
    baseline: object
    comparison: BuildComparison
    options: GateOptions
    results: str  # the results folder
    drift: DriftReport | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def regressions(self) -> list[CaseChange]:
        return self.comparison.of(Verdict.REGRESSION)

    @property
    def missing(self) -> list[CaseChange]:
        return self.comparison.of(Verdict.MISSING)

    @property
    def failing(self) -> list[CaseChange]:
        return self.regressions + ([] if self.options.allow_missing else self.missing)

    @property
    def failing_drift(self) -> bool:
        return self.options.fail_on_drift and self.drift is not None and bool(self.drift.drifts)

    def __bool__(self) -> bool:
        return not self.failing and not self.failing_drift

    @property
    def exit_code(self) -> int:
        return 0 if self else 1


def run_gate(store, *, build: str, baseline: str, options: GateOptions = GateOptions(),
             hooks: Hooks | None = None) -> GateReport:
    hooks = hooks or Hooks()
    start = time.perf_counter()
    comparison = compare_builds(store, build, baseline, expectations=options.expectations)
    report = GateReport(build=store.build(build), baseline=store.build(baseline), comparison=comparison,
                        options=options, results=str(store.folder),
                        drift=precision_drift(store, build, baseline, factor=options.drift_factor))
    hooks.call("gate_start", report=report)
    candidates = comparison.of(Verdict.REGRESSION)
    if candidates and (options.reruns or options.write_repros):
        _rerun_and_reproduce(store, report, candidates, hooks)
    comparison.sort()
    report.seconds = time.perf_counter() - start
    hooks.call("gate_finish", report=report)
    return report


def _rerun_and_reproduce(store, report: GateReport, candidates: list[CaseChange], hooks: Hooks) -> None:
    options, build = report.options, report.build
    settings = settings_for_build(
        build.manifest, timeout_s=options.timeout_s,
        # Per build: reproducers are named by case id, which every build shares.
        artifacts_dir=str(store.folder / "artifacts" / "gate" / slug(build.id)),
    )
    by_id = {c.case_id: c for c in candidates}
    statuses: dict[str, list[Status]] = {c.case_id: [] for c in candidates}
    repros: dict[str, str] = {}

    rerunnable = []
    for change in candidates:
        if change.case.id != change.case_id:  # e.g. a store migrated from v1, which lost case seeds
            report.notes.append(f"{change.title}: cannot be rebuilt exactly from the store; not rerun")
        else:
            rerunnable.append(change)
    if options.reruns:
        chosen = rerunnable[:options.max_reruns]
        if len(rerunnable) > len(chosen):
            report.notes.append(f"{len(rerunnable) - len(chosen)} regressions were not rerun (over --max-reruns "
                                f"{options.max_reruns}); they count as regressions")
        queue = deque(Job(case=c.case, attempt=1) for c in chosen)
        try:
            for job, outcome in Supervisor(settings, jobs=options.jobs, fresh=True).run_jobs(queue):
                case_id = job.case.id
                store.record_rerun(build.id, job.case, outcome)
                statuses[case_id].append(outcome.status)
                if outcome.repro:
                    repros[case_id] = store.relative(outcome.repro)
                hooks.call("gate_rerun", change=by_id[case_id], attempt=job.attempt, outcome=outcome)
                if outcome.status is not Status.PASS and job.attempt < options.reruns:
                    queue.append(Job(case=job.case, attempt=job.attempt + 1))
        except TransportError as exc:
            report.notes.append(f"reruns stopped: {exc}; cases not rerun count as regressions")

    for change in candidates:
        change = report.comparison.get(change.case_id)
        seen = tuple(statuses[change.case_id])
        verdict = Verdict.FLAKY if Status.PASS in seen else Verdict.REGRESSION
        # The original run's reproducer first: it is the failure the gate reports.
        report.comparison.replace(change, verdict=verdict, reruns=seen,
                                  repro=change.repro or repros.get(change.case_id))

    if not options.write_repros:
        return
    lacking = [c for c in report.regressions if not c.repro and c.case.id == c.case_id]
    if not lacking:
        return
    originals = {c.case_id: store.result(build.id, c.case_id).outcome for c in lacking}
    queue = deque(Job(case=c.case, repro_of=originals[c.case_id]) for c in lacking)
    try:
        for job, outcome in Supervisor(settings, jobs=options.jobs, fresh=True).run_jobs(queue):
            change = report.comparison.get(job.case.id)
            if outcome.repro:
                store.set_artifact(build.id, change.case_id, "repro", outcome.repro)
                report.comparison.replace(change, repro=store.relative(outcome.repro))
            elif outcome.evidence.get("repro_error"):
                report.notes.append(f"{change.title}: no reproducer: {outcome.evidence['repro_error']}")
    except TransportError as exc:
        report.notes.append(f"reproducers not written: {exc}")
