"""The gate's JUnit XML reporter (a plugin on the gate's hooks).

JUnit XML is what CI systems display (GitHub test reporters, GitLab, Jenkins,
Buildkite). One ``testcase`` per case of the build; the file agrees with the
gate's exit code: a ``failure`` is exactly what fails the gate (regressions,
missing cases, and precision drift under ``--fail-on-drift``; without it a
drifted case passes and says so in ``system-out``). Cases that fail without failing the gate (known failures,
failures the baseline had too, new cases that fail) are ``skipped`` with the
reason, so a green gate never shows red tests. A flaky case passes and says
so in ``system-out``. The classname groups cases as CI viewers expect
(``op.nn.functional.gelu``, ``model.timm.resnet18``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from runner.reporters import junit_document, junit_result, junit_testcase, write_junit, xml_text

from .baseline import Verdict
from .report import display_path

FAILURE = (Verdict.REGRESSION, Verdict.MISSING)
SKIPPED = (Verdict.XFAIL, Verdict.STILL_FAILING, Verdict.NEW_FAILURE, Verdict.SKIP)


def _status(s) -> str:
    return "none" if s is None else s.value


class JUnitReporter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def gate_finish(self, report) -> None:
        changes = report.comparison.changes
        failing = {Verdict.REGRESSION} if report.options.allow_missing else set(FAILURE)
        skipping = set(SKIPPED) | (set(FAILURE) - failing)
        drifts = {d.case_id: d for d in report.drift.drifts} if report.drift is not None else {}
        gated_drift = set(drifts) if report.options.fail_on_drift else set()
        failures = sum(c.verdict in failing or c.case_id in gated_drift for c in changes)
        skipped = sum(c.verdict in skipping for c in changes)
        total_time = sum(c.duration for c in changes)
        name = f"neuron-conformance gate: {report.build.id} vs {report.baseline.id}"
        root, suite = junit_document(
            name, tests=len(changes), failures=failures, skipped=skipped, seconds=total_time,
            properties=(("build", report.build.id), ("baseline", report.baseline.id), ("target", report.build.label),
                        ("results", report.results), ("reruns", str(report.options.reruns))))
        for c in changes:
            tc = junit_testcase(suite, c.case, name=c.title, seconds=c.duration)
            transition = f"{_status(c.baseline)} -> {_status(c.current)}"
            lines = [f"case {c.case_id}: {transition}"]
            if c.message:
                lines.append(c.message)
            repro = display_path(report.results, c.repro)
            if repro:
                lines.append(f"reproducer: python {repro}")
            if c.reruns:
                lines.append("reruns in fresh processes: " + ", ".join(s.value for s in c.reruns))
            if c.known is not None:
                lines.append(f"known failure: {c.known.reason} ({c.known.issue})")
            if c.case_id in drifts:
                lines.append(f"precision drift: {drifts[c.case_id].describe()}")
            body = "\n".join(lines)
            if c.case_id in gated_drift:
                junit_result(tc, "failure", type="precision_drift", body=body,
                             message=f"precision drift: {drifts[c.case_id].describe()}")
            elif c.verdict in failing:
                junit_result(tc, "failure", type=c.verdict.value, body=body,
                             message=f"{c.verdict.value}: {transition}: {c.message}")
            elif c.verdict in skipping:
                reason = {
                    Verdict.XFAIL: f"known failure: {c.known.reason if c.known else ''}",
                    Verdict.STILL_FAILING: f"failing in the baseline too ({_status(c.baseline)})",
                    Verdict.NEW_FAILURE: "fails, with no passing baseline result",
                    Verdict.SKIP: "could not be judged",
                    Verdict.MISSING: "no result in this build (allowed)",
                }[c.verdict]
                junit_result(tc, "skipped", type=c.verdict.value, body=body, message=f"{reason}: {c.message}")
            elif c.verdict in (Verdict.FLAKY, Verdict.XPASS, Verdict.FIXED) or c.case_id in drifts:
                ET.SubElement(tc, "system-out").text = xml_text(f"{c.verdict.value}\n{body}")
        write_junit(root, self.path)
