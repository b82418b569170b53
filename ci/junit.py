"""The gate's JUnit XML reporter (a plugin on the gate's hooks).

JUnit XML is what CI systems display (GitHub test reporters, GitLab, Jenkins,
Buildkite). One ``testcase`` per case of the build; the file agrees with the
gate's exit code: a ``failure`` is exactly what fails the gate (regressions,
missing cases). Cases that fail without failing the gate (known failures,
failures the baseline had too, new cases that fail) are ``skipped`` with the
reason, so a green gate never shows red tests. A flaky case passes and says
so in ``system-out``. The classname groups cases as CI viewers expect
(``op.nn.functional.gelu``, ``model.timm.resnet18``).
"""

from __future__ import annotations

import datetime
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

from .compare import Verdict
from .report import display_path

FAILURE = (Verdict.REGRESSION, Verdict.MISSING)
SKIPPED = (Verdict.XFAIL, Verdict.STILL_FAILING, Verdict.NEW_FAILURE, Verdict.SKIP)
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: str) -> str:
    """XML 1.0 cannot hold control characters, which error messages sometimes do."""
    return _INVALID_XML.sub("\ufffd", str(text))


def _status(s) -> str:
    return "none" if s is None else s.value


def classname(case) -> str:
    return ".".join(p for p in (case.kind, case.family if case.kind != "op" else "", case.name) if p)


class JUnitReporter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def gate_finish(self, report) -> None:
        changes = report.comparison.changes
        failing = {Verdict.REGRESSION} if report.options.allow_missing else set(FAILURE)
        skipping = set(SKIPPED) | (set(FAILURE) - failing)
        failures = sum(c.verdict in failing for c in changes)
        skipped = sum(c.verdict in skipping for c in changes)
        total_time = sum(c.duration for c in changes)
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        name = f"neuron-conformance gate: {report.build.id} vs {report.baseline.id}"
        root = ET.Element("testsuites", name=_clean(name), tests=str(len(changes)), failures=str(failures),
                          errors="0", skipped=str(skipped), time=f"{total_time:.3f}")
        suite = ET.SubElement(root, "testsuite", name=_clean(name), tests=str(len(changes)), failures=str(failures),
                              errors="0", skipped=str(skipped), time=f"{total_time:.3f}", timestamp=stamp,
                              hostname=socket.gethostname())
        props = ET.SubElement(suite, "properties")
        for key, value in (("build", report.build.id), ("baseline", report.baseline.id),
                           ("target", report.build.label), ("results", report.results),
                           ("reruns", str(report.options.reruns))):
            ET.SubElement(props, "property", name=key, value=_clean(value))
        for c in changes:
            tc = ET.SubElement(suite, "testcase", classname=_clean(classname(c.case)), name=_clean(c.title),
                               time=f"{c.duration:.3f}")
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
            body = _clean("\n".join(lines))
            if c.verdict in failing:
                el = ET.SubElement(tc, "failure", type=c.verdict.value,
                                   message=_clean(f"{c.verdict.value}: {transition}: {c.message}"[:500]))
                el.text = body
            elif c.verdict in skipping:
                reason = {
                    Verdict.XFAIL: f"known failure: {c.known.reason if c.known else ''}",
                    Verdict.STILL_FAILING: f"failing in the baseline too ({_status(c.baseline)})",
                    Verdict.NEW_FAILURE: "fails, with no passing baseline result",
                    Verdict.SKIP: "could not be judged",
                    Verdict.MISSING: "no result in this build (allowed)",
                }[c.verdict]
                el = ET.SubElement(tc, "skipped", type=c.verdict.value, message=_clean(f"{reason}: {c.message}"[:500]))
                el.text = body
            elif c.verdict in (Verdict.FLAKY, Verdict.XPASS, Verdict.FIXED):
                ET.SubElement(tc, "system-out").text = _clean(f"{c.verdict.value}\n{body}")
        ET.indent(root)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(root).write(self.path, encoding="utf-8", xml_declaration=True)
