"""The suite's reporters, each a plugin on the suite hooks (hookspecs.py).

- :class:`StoreWriter` records the build and every outcome in the results store, one committed
  transaction each, so a killed run keeps everything it reported;
- :class:`ProgressReporter` draws a progress bar on a terminal, and prints each failure and, every minute, the
  cases done, the rate and the time left (:class:`Eta`) in a log;
- :class:`JsonLinesWriter` appends one JSON object per outcome to a file (``--jsonl``), for tools;
- :class:`JUnitWriter` writes JUnit XML of the cases run (``--junit``), for CI viewers.
"""

from __future__ import annotations

import datetime
import json
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

from conformance.outcome import FAILING, Status

_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    """XML 1.0 cannot hold control characters, which error messages sometimes do."""
    return _INVALID_XML.sub("\ufffd", str(text))


def junit_classname(case) -> str:
    """How CI viewers group cases: ``op.nn.functional.gelu``, ``model.timm.resnet18``, ``script.examples``."""
    return ".".join(p for p in (case.kind, case.category if case.kind != "op" else "", case.name) if p)


def junit_document(name: str, *, tests: int, failures: int, skipped: int, seconds: float,
                   properties: tuple[tuple[str, str], ...]) -> tuple[ET.Element, ET.Element]:
    """The ``testsuites`` root and its one ``testsuite``, with the counts CI viewers show and the run's
    properties; the suite's and the gate's JUnit files share it, so viewers read both alike."""
    counts = dict(tests=str(tests), failures=str(failures), errors="0", skipped=str(skipped), time=f"{seconds:.3f}")
    root = ET.Element("testsuites", name=xml_text(name), **counts)
    suite = ET.SubElement(root, "testsuite", name=xml_text(name), **counts,
                          timestamp=datetime.datetime.now().isoformat(timespec="seconds"),
                          hostname=socket.gethostname())
    props = ET.SubElement(suite, "properties")
    for key, value in properties:
        ET.SubElement(props, "property", name=key, value=xml_text(value))
    return root, suite


def junit_testcase(suite: ET.Element, case, *, name: str, seconds: float) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=xml_text(junit_classname(case)), name=xml_text(name),
                         time=f"{seconds:.3f}")


def junit_result(testcase: ET.Element, tag: str, *, message: str, body: str, type: str | None = None) -> None:
    """A ``failure`` or ``skipped`` element: a one-line message (500 characters at most) and the full body."""
    attrs = {"type": type} if type else {}
    ET.SubElement(testcase, tag, **attrs, message=xml_text(message[:500])).text = xml_text(body)


def write_junit(root: ET.Element, path: Path) -> None:
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


class OnOutcome:
    """Calls ``fn(case, outcome)`` for each outcome: a reporter written as a function (benchmarks, tests)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def case_outcome(self, run, case, outcome) -> None:
        self.fn(case, outcome)


class StoreWriter:
    """Records the build once and each outcome as it arrives."""

    def __init__(self, store) -> None:
        self.store = store

    def suite_start(self, run) -> None:
        self.store.ensure_build(run.build_id, target=run.settings.target, label=run.target_label,
                                manifest=run.manifest)

    def case_outcome(self, run, case, outcome) -> None:
        self.store.record(run.build_id, case, outcome)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


class Eta:
    """Cases done, the rate and the time left of a run, from the outcomes as they arrive.

    The rate counts from the first outcome (the workers' start is not a case's cost), over the last
    ``window`` outcomes once there are that many, so it follows the kind of cases running now; cases the
    build already held (``--resume``) count as done and cost nothing.
    """

    def __init__(self, total: int, *, resumed: int = 0, window: int = 200, clock=None) -> None:
        import time
        from collections import deque

        self.total, self.done, self.resumed = total, resumed, resumed
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self._times: deque[float] = deque(maxlen=window + 1)

    def add(self) -> None:
        self.done += 1
        self._times.append(self.clock())

    @property
    def rate_per_min(self) -> float | None:
        if len(self._times) < 2 or self._times[-1] <= self._times[0]:
            return None
        return (len(self._times) - 1) / (self._times[-1] - self._times[0]) * 60

    def line(self, label: str) -> str:
        """``models: 1,234 / 5,000 (24.7%), 95.2 cases/min, about 39m30s left (elapsed 13m05s)``."""
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate = self.rate_per_min
        left = (f", {rate:.1f} cases/min, about {_duration((self.total - self.done) / rate * 60)} left"
                if rate else "")
        resumed = f", {self.resumed:,} stored before" if self.resumed else ""
        return (f"{label}: {self.done:,} / {self.total:,} ({pct:.1f}%){left}{resumed} "
                f"(elapsed {_duration(self.clock() - self.started)})")


class ProgressReporter:
    """A rich progress bar on a terminal; in a log (not a terminal), one line per failing case and a progress
    line with the rate and the time left every ``every_s`` seconds (a nightly's log says how far it is)."""

    def __init__(self, description: str, console=None, *, every_s: float = 60.0) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.console = console or Console(highlight=False)
        self.description = description
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[last]}"), console=self.console,
            disable=not self.console.is_terminal, transient=False)
        self.task = None
        self.every_s = every_s
        self.eta: Eta | None = None
        self._printed = 0.0

    def suite_start(self, run) -> None:
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=len(run.cases), last="")
        self.eta = Eta(run.total, resumed=run.total - len(run.cases))
        self._printed = self.eta.clock()

    def case_outcome(self, run, case, outcome) -> None:
        self.progress.update(self.task, advance=1, last=f"{outcome.status.value:12s} {case.title[:60]}")
        self.eta.add()
        if self.console.is_terminal:
            return
        if outcome.failed:
            self.console.print(f"  {outcome.status.value:12s} {case.title}: {outcome.message[:200]}", markup=False,
                               soft_wrap=True)
        if self.eta.clock() - self._printed >= self.every_s:
            self._printed = self.eta.clock()
            self.console.print(self.eta.line(self.description), markup=False, soft_wrap=True)

    def suite_finish(self, run, summary) -> None:
        self.progress.stop()
        if summary.retries_line:
            self.console.print(summary.retries_line, markup=False, soft_wrap=True)


class JsonLinesWriter:
    """One line per outcome: ``{"build": ..., "case": {...}, "case_id": ..., "outcome": {...}}``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.file = None

    def suite_start(self, run) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")

    def case_outcome(self, run, case, outcome) -> None:
        record = {"build": run.build_id, "case_id": case.id, "title": case.title, "case": case.to_dict(),
                  "outcome": outcome.to_dict()}
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()

    def suite_finish(self, run, summary) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class JUnitWriter:
    """JUnit XML of this run's cases: failing outcomes are failures, skips are skipped."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.rows: list = []

    def case_outcome(self, run, case, outcome) -> None:
        self.rows.append((case, outcome))

    def suite_finish(self, run, summary) -> None:
        failures = sum(o.status in FAILING for _, o in self.rows)
        skipped = sum(o.status is Status.SKIP for _, o in self.rows)
        total = sum(o.duration_s for _, o in self.rows)
        name = f"neuron-conformance: {run.build_id} on {run.target_label}"
        root, suite = junit_document(name, tests=len(self.rows), failures=failures, skipped=skipped, seconds=total,
                                     properties=(("build", run.build_id), ("target", run.target_label)))
        for case, outcome in sorted(self.rows, key=lambda r: r[0].title):
            tc = junit_testcase(suite, case, name=case.title, seconds=outcome.duration_s)
            body = (f"case {case.id}: {outcome.status.value}\n{outcome.message}"
                    + (f"\nreproducer: python {outcome.repro}" if outcome.repro else ""))
            if outcome.status in FAILING:
                junit_result(tc, "failure", type=outcome.status.value, body=body,
                             message=f"{outcome.status.value}: {outcome.message}")
            elif outcome.status is Status.SKIP:
                junit_result(tc, "skipped", message=outcome.message, body=body)
        write_junit(root, self.path)

__all__ = ["Eta", "JUnitWriter", "JsonLinesWriter", "OnOutcome", "ProgressReporter", "StoreWriter", "junit_classname",
           "junit_document", "junit_result", "junit_testcase", "write_junit", "xml_text"]
