"""Running a suite of cases into the results store.

This is what ``neuron-conformance ops`` and ``models`` share: shard the
cases, skip what the store already holds for this build (``--resume``), run
the rest on an executor, write each outcome as it arrives, and report
progress and a summary.
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .case import Case, shard
from .outcome import Outcome, Status
from .settings import RunSettings


@dataclass(kw_only=True)
class SuiteSummary:
    build_id: str
    total: int
    ran: int
    skipped_resume: int
    counts: dict[str, int] = field(default_factory=dict)
    by_dtype: dict[str, dict[str, int]] = field(default_factory=dict)
    by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def failures(self) -> int:
        failing = {s.value for s in Status if s in (Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED,
                                                   Status.CPU_FALLBACK, Status.CRASH, Status.TIMEOUT)}
        return sum(n for s, n in self.counts.items() if s in failing)


def default_build_id(target_label: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{target_label.split()[0]}-{stamp}-{socket.gethostname()}"


def make_executor(kind: str, settings: RunSettings, jobs: int, address: str | None = None):
    if kind == "local":
        from .pool import LocalPool

        return LocalPool(settings, jobs=jobs)
    if kind == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(settings, jobs=jobs, address=address)
    raise ValueError(f"--executor {kind!r}: expected local or ray")


def run_suite(
    cases: list[Case],
    *,
    settings: RunSettings,
    store,
    build_id: str,
    manifest: dict,
    target_label: str,
    jobs: int = 1,
    shard_spec: tuple[int, int] | None = None,
    resume: bool = False,
    executor: str = "local",
    address: str | None = None,
    on_outcome: Callable[[Case, Outcome], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> SuiteSummary:
    import time

    start = time.perf_counter()
    if shard_spec:
        cases = shard(cases, *shard_spec)
    by_id = {c.id: c for c in cases}
    store.ensure_build(build_id, target=settings.target, label=target_label, manifest=manifest)
    done = store.completed(build_id) if resume else set()
    todo = [c for c in cases if c.id not in done]
    summary = SuiteSummary(build_id=build_id, total=len(cases), ran=0, skipped_resume=len(cases) - len(todo))
    if on_start:
        on_start(len(todo))
    runner = make_executor(executor, settings, jobs, address)
    try:
        for outcome in runner.run(todo):
            case = by_id[outcome.case_id]
            store.record(build_id, case, outcome)
            summary.ran += 1
            if on_outcome:
                on_outcome(case, outcome)
    finally:
        close = getattr(runner, "close", None)
        if close:
            close()
    for row in store.results(build_id):
        if row.case.id not in by_id:
            continue
        status = row.outcome.status.value
        summary.counts[status] = summary.counts.get(status, 0) + 1
        for table, key in ((summary.by_dtype, row.case.dtype), (summary.by_family, row.case.family or row.case.name)):
            per = table.setdefault(key or "-", {})
            per[status] = per.get(status, 0) + 1
    summary.seconds = time.perf_counter() - start
    return summary
