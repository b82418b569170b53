"""The gate's terminal reporter (a plugin on the gate's hooks).

Regressions and new failures come in failure groups (results/groups.py):
one headline per root cause ("exp: wrong results for non-contiguous
inputs, 18 cases across 12 dtypes"), its smallest reproducer, and its first
cases. Every other case worth reading gets one line, most important first,
naming its case id; then one summary line. Plain text, so that CI logs can
be searched with grep.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from results.groups import Failure, group_failures

from .baseline import Verdict

LABELS = {
    Verdict.REGRESSION: "REGRESSION",
    Verdict.MISSING: "MISSING",
    Verdict.FLAKY: "FLAKY",
    Verdict.XFAIL: "XFAIL",
    Verdict.XPASS: "XPASS",
    Verdict.FIXED: "FIXED",
    Verdict.NEW_FAILURE: "NEW FAILURE",
}
WIDTH = max(len(v) for v in LABELS.values())
GROUPED = (Verdict.REGRESSION, Verdict.NEW_FAILURE)
MAX_DRIFT_LINES = 20
CASES_PER_GROUP = 5  # case lines shown under a group's headline; the rest are counted
SUMMARY_ORDER = (Verdict.REGRESSION, Verdict.MISSING, Verdict.FLAKY, Verdict.FIXED, Verdict.XFAIL, Verdict.XPASS,
                 Verdict.NEW_FAILURE, Verdict.STILL_FAILING, Verdict.PASS, Verdict.SKIP)


def display_path(results: str, stored: str | None) -> str | None:
    """A stored artifact path as a person at this terminal can use it."""
    if not stored:
        return None
    path = Path(stored)
    path = path if path.is_absolute() else Path(results) / path
    try:
        return os.path.relpath(path) if not os.path.relpath(path).startswith("..") else str(path.resolve())
    except ValueError:  # another drive
        return str(path)


def _repro_bytes(results: str, stored: str | None) -> int | None:
    path = display_path(results, stored)
    if not path:
        return None
    try:
        return sum(p.stat().st_size for p in Path(path).parent.iterdir() if p.is_file())
    except OSError:
        return None


def _status(s) -> str:
    return "none" if s is None else s.value


def plural(n: int, word: str) -> str:
    """``1 regression``, ``2 regressions``; adjectives and statuses stay as they are (``2 flaky``)."""
    return f"{n} {word}s" if n != 1 and word in ("regression", "new failure") else f"{n} {word}"


class TerminalReporter:
    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self._reruns = 0

    def _print(self, text: str = "") -> None:
        print(text, file=self.stream, flush=True)

    def gate_start(self, report) -> None:
        b, base = report.build, report.baseline
        self._reruns = report.options.reruns
        self._print(f"gate: build {b.id} ({b.label}) against baseline {base.id} ({base.label}); "
                    f"results in {report.results}")
        if report.options.expectations is not None:
            self._print(f"expectations: {report.options.expectations.path} "
                        f"({len(report.options.expectations.failures)} known failures)")
        candidates = report.comparison.of(Verdict.REGRESSION)
        if candidates and report.options.reruns:
            self._print(f"rerunning {len(candidates)} regressed case(s) up to {report.options.reruns} time(s) each, "
                        "each time in a fresh process")

    def gate_rerun(self, change, attempt: int, outcome) -> None:
        self._print(f"  rerun {attempt}/{self._reruns}: {change.title}: {outcome.status.value}"
                    + ("" if outcome.status.value == "pass" else f": {outcome.message[:120]}"))

    def gate_finish(self, report) -> None:
        comparison = report.comparison
        for verdict, label in LABELS.items():
            changes = comparison.of(verdict)
            if verdict in GROUPED and changes:
                self._groups(report, label, changes)
                continue
            for c in changes:
                self._line(report, label, c)
        self._drift(report)
        for note in report.notes:
            self._print(f"note: {note}")
        counts = comparison.counts
        parts = [plural(counts[v.value], v.value.replace("_", " ")) for v in SUMMARY_ORDER if counts[v.value]]
        if report.drift is not None and report.drift.drifts:
            parts.append(f"{len(report.drift.drifts)} precision drift" + ("" if report.options.fail_on_drift
                                                                             else " (reported only)"))
        word = "passed" if report else "FAILED"
        self._print(f"gate {word}: {', '.join(parts) or 'no cases'} (build {report.build.id} vs baseline "
                    f"{report.baseline.id}, {report.seconds:.1f} s)")
        if report.missing and not report.options.allow_missing:
            self._print(f"  {len(report.missing)} case(s) passed in the baseline and have no result in this build: "
                        "run them (e.g. a lost shard), or pass --allow-missing if the case set changed on purpose")

    def _drift(self, report) -> None:
        drift = report.drift
        if drift is None:
            return
        if drift.note:
            self._print(f"note: precision drift {drift.note}")
            return
        for d in drift.drifts[:MAX_DRIFT_LINES]:
            self._print(f"{'DRIFT':<{WIDTH}}  {d.describe()}")
            self._print(" " * (WIDTH + 2) + f"case {d.case_id}; still passes")
        if len(drift.drifts) > MAX_DRIFT_LINES:
            self._print(" " * (WIDTH + 2) + f"... and {len(drift.drifts) - MAX_DRIFT_LINES} more precision drifts "
                        "(all are in the dashboard)")

    def _groups(self, report, label: str, changes) -> None:
        by_id = {c.case_id: c for c in changes}
        failures = [Failure(case=c.case, case_id=c.case_id, title=c.title, status=_status(c.current),
                            message=c.message, cause=c.cause, repro=c.repro) for c in changes]
        groups = group_failures(failures, repro_size=lambda stored: _repro_bytes(report.results, stored))
        self._print(f"{len(changes)} {label.lower()}{'s' if len(changes) != 1 else ''} in {len(groups)} "
                    f"group{'s' if len(groups) != 1 else ''} (by op and by what the failing inputs share):")
        for i, g in enumerate(groups, 1):
            self._print(f"GROUP {i} of {len(groups)} ({label.lower()}s): {g.headline}")
            repro = display_path(report.results, g.repro)
            self._print(" " * (WIDTH + 2) + (f"smallest reproducer (of the group's {len(g.members)}): python {repro}"
                                        if repro else "no reproducer written"))
            for m in g.members[:CASES_PER_GROUP]:
                self._line(report, label, by_id[m.case_id])
            if len(g.members) > CASES_PER_GROUP:
                self._print(" " * (WIDTH + 2) + f"... and {len(g.members) - CASES_PER_GROUP} more cases of this group "
                            "(all are in the JUnit XML and the dashboard)")

    def _line(self, report, label: str, c) -> None:
        transition = f"{_status(c.baseline)} -> {_status(c.current)}"
        text = f"{label:<{WIDTH}}  {c.title}  {transition}"
        if c.message and c.verdict not in (Verdict.FIXED, Verdict.XPASS, Verdict.MISSING):
            text += f": {c.message}"
        self._print(text)
        detail = [f"case {c.case_id}"]
        if c.reruns:
            detail.append("reruns: " + ", ".join(s.value for s in c.reruns))
        if c.known is not None:
            detail.append(f"known failure ({c.known.reason}; {c.known.issue}; {c.known.describe()})")
            if c.verdict is Verdict.XPASS:
                detail.append("it passes now: remove the entry from the expectations file")
        if c.verdict in (Verdict.REGRESSION, Verdict.FLAKY, Verdict.NEW_FAILURE):
            repro = display_path(report.results, c.repro)
            detail.append(f"reproducer: python {repro}" if repro else "reproducer: none written")
        self._print(" " * (WIDTH + 2) + "; ".join(detail))
