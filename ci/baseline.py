"""Comparing one build's results with a baseline's: what stopped working, what
started working, what is known to fail.

The gate and the dashboard both ask this question, so both use this module
and nothing else: a case is a regression in the dashboard exactly when the
gate would call it one (before the gate's reruns tell flaky from broken).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from conformance.case import Case
from conformance.outcome import FAILING, Status

from .expectations import Expectations, KnownFailure


class Verdict(str, Enum):
    REGRESSION = "regression"  # passed in the baseline, fails now: the gate fails
    MISSING = "missing"  # passed in the baseline, has no result now: the gate fails (unless allowed)
    FLAKY = "flaky"  # failed now, but passed when rerun in a fresh process
    XFAIL = "xfail"  # fails, and the expectations file says it is known to
    XPASS = "xpass"  # passes, but the expectations file says it fails: the entry can go
    FIXED = "fixed"  # failed in the baseline, passes now
    NEW_FAILURE = "new_failure"  # fails, with no passing baseline result to regress from
    STILL_FAILING = "still_failing"  # failed in the baseline too
    PASS = "pass"
    SKIP = "skip"  # could not be judged (e.g. fails on the reference)

    def __str__(self) -> str:
        return self.value


ORDER = tuple(Verdict)


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseChange:
    verdict: Verdict
    case: Case
    case_id: str
    title: str
    baseline: Status | None  # None: no result in the baseline
    current: Status | None  # None: no result in this build
    message: str = ""
    repro: str | None = None  # as the store holds it (relative to the results folder)
    known: KnownFailure | None = None
    reruns: tuple[Status, ...] = ()  # statuses of the gate's reruns, in order
    duration: float = 0.0
    cause: dict | None = None  # an op case's cause (op_tests/causes.py), which failure groups are named after

    @property
    def failed(self) -> bool:
        return self.current in FAILING


@dataclass(slots=True, kw_only=True)
class BuildComparison:
    build: str
    baseline: str
    changes: list[CaseChange] = field(default_factory=list)
    _index: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def of(self, *verdicts: Verdict) -> list[CaseChange]:
        return [c for c in self.changes if c.verdict in verdicts]

    @property
    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in ORDER}
        for c in self.changes:
            out[c.verdict.value] += 1
        return out

    def get(self, case_id: str) -> CaseChange | None:
        i = self._positions().get(case_id)
        return None if i is None else self.changes[i]

    def replace(self, change: CaseChange, **fields) -> CaseChange:
        """Swaps in a copy of ``change`` with new fields (verdicts after reruns, reproducers)."""
        new = replace(change, **fields)
        self.changes[self._positions()[change.case_id]] = new
        return new

    def sort(self) -> None:
        self.changes.sort(key=lambda c: (ORDER.index(c.verdict), c.title, c.case_id))
        self._index = None

    def _positions(self) -> dict[str, int]:
        if self._index is None or len(self._index) != len(self.changes):
            self._index = {c.case_id: i for i, c in enumerate(self.changes)}
        return self._index


def classify(baseline: Status | None, current: Status | None, known: KnownFailure | None) -> Verdict | None:
    """The verdict for one case; None for a case that neither build judges (missing now, not passing before)."""
    if current is None:
        return Verdict.MISSING if baseline is Status.PASS else None
    if current in FAILING:
        if known is not None:
            return Verdict.XFAIL
        if baseline is Status.PASS:
            return Verdict.REGRESSION
        if baseline in FAILING:
            return Verdict.STILL_FAILING
        return Verdict.NEW_FAILURE
    if current is Status.PASS:
        if known is not None:
            return Verdict.XPASS
        return Verdict.FIXED if baseline in FAILING else Verdict.PASS
    return Verdict.SKIP


DETAILED = (Verdict.REGRESSION, Verdict.FIXED, Verdict.XPASS, Verdict.XFAIL, Verdict.NEW_FAILURE, Verdict.MISSING)


def compare_builds(store, build: str, baseline: str, *, expectations: Expectations | None = None) -> BuildComparison:
    """Every case of either build with its verdict; cases worth a line carry their message and reproducer."""
    store.build(build)
    store.build(baseline)
    if expectations is not None:
        expectations.check_backend(store.build(build).target)
    new = {r.case_id: r for r in store.statuses(build)}
    old = {r.case_id: r for r in store.statuses(baseline)}
    for old_id, now in _renamed_model_cases(store, baseline, old, new).items():
        old[now] = old.pop(old_id)
    comparison = BuildComparison(build=build, baseline=baseline)
    for case_id in dict.fromkeys([*new, *old]):
        row = new.get(case_id) or old[case_id]
        source = build if case_id in new else baseline
        case = Case(kind=row.kind, name=row.name, category=row.category, dtype=row.dtype, mode=row.mode)
        known = expectations.match(case, case_id) if expectations is not None else None
        current = new[case_id].status if case_id in new else None
        before = old[case_id].status if case_id in old else None
        verdict = classify(before, current, known)
        if verdict is None:
            continue
        message, repro, cause = row.message, None, None
        if verdict in DETAILED:
            full = store.result(source, case_id)
            case, repro = full.case, full.outcome.repro
            message, cause = full.outcome.message, full.outcome.evidence.get("cause")
        comparison.changes.append(CaseChange(
            verdict=verdict, case=case, case_id=case_id, title=row.title, baseline=before, current=current,
            message=message, repro=repro, known=known, duration=row.duration, cause=cause,
        ))
    comparison.sort()
    return comparison


def _renamed_model_cases(store, baseline: str, old: dict, new: dict) -> dict[str, str]:
    """Baseline id -> build id of the baseline's model cases that the build has under another id: an architecture
    renamed since (an alias in the model registry), or an id from before ids hashed only the fields a config sets.
    Without this the gate would call each of them missing."""
    lost = [case_id for case_id, row in old.items() if case_id not in new and row.kind == "model"]
    if not lost:
        return {}
    from model_zoo.errors import ModelZooError
    from model_zoo.execute import current_case

    renamed = {}
    for case_id in lost:
        try:
            now = current_case(store.result(baseline, case_id).case).id
        except (ValueError, ModelZooError):  # a config this version cannot read: it stays missing
            continue
        if now in new and now not in old:
            renamed[case_id] = now
    return renamed


def flaky_from_reruns(comparison: BuildComparison, reruns: dict) -> None:
    """Marks regressions that passed on a recorded rerun as flaky (the dashboard's view of the gate's reruns)."""
    for change in comparison.of(Verdict.REGRESSION):
        attempts = reruns.get(change.case_id, [])
        statuses = tuple(r.outcome.status for r in attempts)
        if Status.PASS in statuses:
            comparison.replace(change, verdict=Verdict.FLAKY, reruns=statuses)
        elif statuses:
            comparison.replace(change, reruns=statuses)
    comparison.sort()
