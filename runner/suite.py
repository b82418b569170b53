"""Running a suite of cases: what ``neuron-conformance ops``, ``models`` and ``scripts`` share.

Shard the cases, leave out what the build already holds (``--resume``), run
the rest on the supervisor, and tell the reporters (plugins on the suite's
hooks, see hookspecs.py) as each outcome arrives. Writing the results store,
progress lines, JSON lines and JUnit XML are all reporters; the suite itself
writes nothing.
"""

from __future__ import annotations

import datetime
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from conformance.case import Case, shard
from conformance.outcome import FAILING, Status
from conformance.plugins import Hooks
from conformance.settings import RunSettings
from results.store import RETRIES_KEY

from .hookspecs import PREFIXES, SuiteHooks
from .supervisor import Supervisor


@dataclass(kw_only=True)
class SuiteRun:
    """What a suite run is about; reporters get it with every hook."""

    build_id: str
    settings: RunSettings
    manifest: dict
    target_label: str
    cases: list[Case]  # the cases this run executes (after sharding and resume)
    total: int  # the cases of the selection (after sharding)


@dataclass(kw_only=True)
class SuiteSummary:
    build_id: str
    total: int
    ran: int
    skipped_resume: int
    counts: dict[str, int] = field(default_factory=dict)
    by_dtype: dict[str, dict[str, int]] = field(default_factory=dict)
    by_category: dict[str, dict[str, int]] = field(default_factory=dict)  # Case.category (else its name)
    seconds: float = 0.0
    case_seconds: float = 0.0  # the cases' own time, summed over workers (their outcomes' durations)
    # The harness's own retries (a lost node, a killed worker, a shared memory cap): not the backend's failures.
    retried: int = 0  # cases run again
    retry_reasons: dict[str, int] = field(default_factory=dict)
    worker_starts: dict[str, int] = field(default_factory=dict)  # why each worker was started (Supervisor.starts)
    warmup_seconds: float = 0.0  # from start to ready, summed over the workers started

    @property
    def failures(self) -> int:
        return sum(n for s, n in self.counts.items() if Status(s) in FAILING)

    def add_retries(self, retries: list[dict]) -> None:
        self.retried += 1
        for r in retries:
            reason = {"memory": "memory cap shared by both sides",
                      "worker state": "reference raised in a used worker"}.get(r.get("kind"), r.get("reason", "?"))
            self.retry_reasons[reason] = self.retry_reasons.get(reason, 0) + 1

    @property
    def retries_line(self) -> str:
        """One line naming the harness's retries apart from the backend's failures ("" when none)."""
        if not self.retried:
            return ""
        reasons = ", ".join(f"{reason} x{n}" for reason, n in sorted(self.retry_reasons.items()))
        return (f"harness retries: {self.retried} case{'s' if self.retried > 1 else ''} ran again for causes "
                f"outside the backend ({reasons}); each is recorded once, with the verdict of its own run")

    def overhead_note(self, jobs: int) -> str:
        """``, 1.08x the cases' own time on 2 workers``: what the run cost beyond its cases (worker starts,
        restarts after crashes, reference probes, the last cases' tail); "" before any case ran."""
        if not self.case_seconds or not self.seconds:
            return ""
        return f", {self.seconds * jobs / self.case_seconds:.2f}x the cases' own time on {jobs} worker" \
               f"{'s' if jobs > 1 else ''}"

    @property
    def starts_line(self) -> str:
        """``3 worker starts (2 pool, 1 died), 14.2 s from start to ready``: the restarts a run paid for."""
        if not self.worker_starts:
            return ""
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.worker_starts.items(), key=lambda kv: -kv[1]))
        return (f"{sum(self.worker_starts.values())} worker starts ({why}), "
                f"{self.warmup_seconds:.1f} s from start to ready in all")

    def add(self, case: Case, status: Status) -> None:
        self.counts[status.value] = self.counts.get(status.value, 0) + 1
        for table, key in ((self.by_dtype, case.dtype), (self.by_category, case.category or case.name)):
            per = table.setdefault(key or "-", {})
            per[status.value] = per.get(status.value, 0) + 1


def default_build_id(target_label: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{target_label.split()[0]}-{stamp}-{socket.gethostname()}"


def selection_digest(case_ids: Iterable[str]) -> str:
    """A hash of the cases a run selected (before sharding), whatever their order."""
    import hashlib

    h = hashlib.blake2b(digest_size=12)
    for case_id in sorted(case_ids):
        h.update(case_id.encode())
    return h.hexdigest()


# What makes two results one build: the same target and backend, the same reference library, the same faults,
# and (where both recorded it) the same selection of cases. Hosts, Python builds and times may differ.
_BUILD_FIELDS = ("target", "torch", "torch_neuronx", "neuronx_cc", "cuda", "emulator_faults")


def same_build(stored: Mapping, other: Mapping) -> str | None:
    """None when two build manifests (a shard's, a resumed run's) describe one build, else what differs."""
    differ = [f"{key} {stored.get(key)!r} vs {other.get(key)!r}" for key in _BUILD_FIELDS
              if stored.get(key) != other.get(key)]
    profiles = [(m.get("emulator_profile") or {}).get("name") for m in (stored, other)]
    if profiles[0] != profiles[1]:
        differ.append(f"emulator profile {profiles[0]!r} vs {profiles[1]!r}")
    selections = [(m.get("selection") or {}) for m in (stored, other)]
    if (all(sel.get("digest") for sel in selections) and selections[0].get("kind") == selections[1].get("kind")
            and selections[0]["digest"] != selections[1]["digest"]):
        differ.append(f"another selection of cases ({selections[0].get('cases')} vs {selections[1].get('cases')} "
                      f"{selections[0].get('command', 'cases')})")
    return "; ".join(differ) or None


def previous_durations(store, build_id: str, *, builds: int = 2) -> dict[str, float]:
    """How long each case took in the store's latest other builds (the longest seen): what orders a run."""
    durations: dict[str, float] = {}
    for b in [b for b in store.builds() if b.id != build_id][-builds:]:
        for row in store.statuses(b.id):
            if row.duration:
                durations[row.case_id] = max(durations.get(row.case_id, 0.0), row.duration)
    return durations


def longest_first(cases: list[Case], durations: Mapping[str, float]) -> list[Case]:
    """Cases no earlier build timed first (they may be long), then the rest longest first, so the run does
    not end with one worker on a long case while the others wait: the tail of a run is its longest cases."""
    if not durations:
        return list(cases)
    unknown = [c for c in cases if c.id not in durations]
    return unknown + sorted((c for c in cases if c.id in durations), key=lambda c: -durations[c.id])


def suite_hooks(plugins: Iterable[object] = ()) -> Hooks:
    return Hooks(SuiteHooks, prefixes=PREFIXES, plugins=plugins)


def run_suite(
    cases: list[Case],
    *,
    settings: RunSettings,
    build_id: str,
    manifest: dict,
    target_label: str,
    plugins: Iterable[object] = (),
    jobs: int = 1,
    shard_spec: tuple[int, int] | None = None,
    done: Mapping[str, Status] | None = None,
    executor: str = "local",
    address: str | None = None,
    durations: Mapping[str, float] | None = None,
) -> SuiteSummary:
    """Runs ``cases`` and returns the build's summary.

    ``done``: statuses the build already holds (``--resume``); those cases
    are not run again, and count in the summary as recorded. ``durations``:
    how long cases took before (:func:`previous_durations`); the run starts
    with the longest.
    """
    start = time.perf_counter()
    hooks = suite_hooks(plugins)
    if shard_spec:
        cases = shard(cases, *shard_spec)
    done = dict(done or {})
    todo = longest_first([c for c in cases if c.id not in done], durations or {})
    run = SuiteRun(build_id=build_id, settings=settings, manifest=manifest, target_label=target_label, cases=todo,
                   total=len(cases))
    summary = SuiteSummary(build_id=build_id, total=len(cases), ran=0, skipped_resume=len(cases) - len(todo))
    for case in cases:
        if case.id in done:
            summary.add(case, done[case.id])
    by_id = {c.id: c for c in todo}
    hooks.call("suite_start", run=run)
    supervisor = Supervisor(settings, jobs=jobs, transport=executor, address=address,
                            on_progress=lambda case, event: hooks.call("case_progress", run=run, case=case, event=event))
    with supervisor:
        for outcome in supervisor.run(todo):
            case = by_id[outcome.case_id]
            summary.ran += 1
            summary.case_seconds += outcome.duration_s
            summary.add(case, outcome.status)
            if outcome.evidence.get(RETRIES_KEY):
                summary.add_retries(outcome.evidence[RETRIES_KEY])
            hooks.call("case_outcome", run=run, case=case, outcome=outcome)
    summary.worker_starts, summary.warmup_seconds = dict(supervisor.starts), supervisor.warmup_seconds
    summary.seconds = time.perf_counter() - start
    hooks.call("suite_finish", run=run, summary=summary)
    return summary


__all__ = ["SuiteRun", "SuiteSummary", "default_build_id", "longest_first", "previous_durations", "run_suite",
           "same_build", "selection_digest", "suite_hooks"]
