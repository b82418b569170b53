"""Coverage figures of one build, from its result rows: the numbers a dashboard leads with.

Two headlines, in the form backend coverage is usually quoted ("89% of the
top-100 text-generation architectures"):

- operators: the share of op x dtype pairs that pass, where a pair passes
  when every case of it (forward and backward) passes;
- models: per family, the share of architectures that pass forward (mode
  ``eval``), backward (``train``: one step with gradients) and training
  (``stepsK``: K optimizer steps). An architecture passes a column when it
  has cases in that mode and all of them pass; a family with no case in a
  mode shows "not run" there rather than 0%.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from conformance.outcome import FAILING, Status

COLUMNS = ("forward", "backward", "training")


def model_column(mode: str) -> str | None:
    if mode == "eval":
        return "forward"
    if mode == "train":
        return "backward"
    if mode.startswith("steps"):
        return "training"
    return None


def op_key(row) -> str:
    return f"{row.name}.{row.category}" if row.category else row.name  # the OpInfo variant


@dataclass(frozen=True, slots=True, kw_only=True)
class Rate:
    passed: int
    total: int

    @property
    def percent(self) -> float | None:
        return 100.0 * self.passed / self.total if self.total else None

    def __str__(self) -> str:
        p = self.percent
        return "not run" if p is None else f"{p:.1f}% ({self.passed} / {self.total})"


@dataclass(slots=True, kw_only=True)
class Cell:
    """One op x dtype pair (or one architecture x column): the statuses of its cases, by mode."""

    statuses: dict[str, Status] = field(default_factory=dict)  # mode -> status
    case_ids: dict[str, str] = field(default_factory=dict)  # mode -> case id

    @property
    def state(self) -> str:
        """pass | fail | partial | skip: what colour the cell gets."""
        values = list(self.statuses.values())
        if not values:
            return "none"
        if all(s is Status.PASS for s in values):
            return "pass"
        if all(s in FAILING for s in values):
            return "fail"
        if any(s is Status.PASS for s in values):
            return "partial"
        if any(s in FAILING for s in values):
            return "fail"
        return "skip"

    @property
    def passes(self) -> bool:
        return self.state == "pass"

    @property
    def judged(self) -> bool:
        return self.state != "skip"

    def describe(self) -> str:
        return ", ".join(f"{m}: {s.value}" for m, s in sorted(self.statuses.items()))


@dataclass(slots=True, kw_only=True)
class OpMatrix:
    dtypes: list[str]
    ops: list[str]
    cells: dict[tuple[str, str], Cell]

    @property
    def pairs(self) -> Rate:
        judged = [c for c in self.cells.values() if c.judged]
        return Rate(passed=sum(c.passes for c in judged), total=len(judged))


def _inputs_label(title: str) -> str:
    """``{layouts}`` from ``op:exp[float32,forward]{layouts}``: where an op case's inputs come from."""
    return title[title.rindex("{"):] if title.endswith("}") and "{" in title else ""


def op_matrix(rows: Iterable) -> OpMatrix:
    cells: dict[tuple[str, str], Cell] = {}
    for r in rows:
        if r.kind != "op":
            continue
        cell = cells.setdefault((op_key(r), r.dtype or "-"), Cell())
        # One entry per case: OpInfo's, the hypothesis examples' and each input strategy's, per direction.
        key = (r.mode or "-") + _inputs_label(getattr(r, "title", ""))
        cell.statuses[key] = r.status
        cell.case_ids[key] = r.case_id
    return OpMatrix(dtypes=sorted({d for _, d in cells}), ops=sorted({o for o, _ in cells}), cells=cells)


@dataclass(slots=True, kw_only=True)
class Architecture:
    family: str
    name: str
    columns: dict[str, Cell] = field(default_factory=dict)  # forward/backward/training -> cell (mode x dtype)


@dataclass(slots=True, kw_only=True)
class FamilyCoverage:
    family: str
    architectures: list[Architecture]

    def rate(self, column: str) -> Rate:
        ran = [a for a in self.architectures if column in a.columns]
        if not ran:
            return Rate(passed=0, total=0)
        return Rate(passed=sum(a.columns[column].passes for a in ran), total=len(self.architectures))


def model_families(rows: Iterable) -> list[FamilyCoverage]:
    archs: dict[tuple[str, str], Architecture] = {}
    for r in rows:
        if r.kind != "model":
            continue
        column = model_column(r.mode)
        arch = archs.setdefault((r.category, r.name), Architecture(family=r.category, name=r.name))  # its family
        if column is None:
            continue
        cell = arch.columns.setdefault(column, Cell())
        key = f"{r.mode}/{r.dtype}" if r.dtype else r.mode
        cell.statuses[key] = r.status
        cell.case_ids[key] = r.case_id
    families: dict[str, list[Architecture]] = {}
    for (family, _), arch in sorted(archs.items()):
        families.setdefault(family, []).append(arch)
    return [FamilyCoverage(family=f or "-", architectures=a) for f, a in families.items()]


WITHIN_PRECISION = "within device precision"  # how a pass that needed the noise floor says so (diff.precision)
VERDICTS = ("pass", "within precision", "mismatch", "inconclusive", "other failures")


def verdict_of(row) -> str | None:
    """pass | within precision | mismatch | inconclusive | other failures; None for a skip."""
    if row.status is Status.PASS:
        return "within precision" if WITHIN_PRECISION in (getattr(row, "message", "") or "") else "pass"
    if row.status is Status.MISMATCH:
        return "mismatch"
    if row.status is Status.INCONCLUSIVE:
        return "inconclusive"
    return "other failures" if row.status in FAILING else None


def verdicts_by_family(rows: Iterable) -> dict[str, dict[str, int]]:
    """Per family (``ops`` for op cases, the model family for zoo cases): cases per verdict. Under a
    profile with reduced precision this separates differences the precision model explains from faults."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        verdict = verdict_of(r)
        if verdict is None or r.kind not in ("op", "model"):
            continue
        family = "ops" if r.kind == "op" else (r.category or "-")
        counts = out.setdefault(family, {v: 0 for v in VERDICTS})
        counts[verdict] += 1
    return dict(sorted(out.items(), key=lambda kv: (kv[0] != "ops", kv[0])))


@dataclass(frozen=True, slots=True, kw_only=True)
class Completeness:
    """How much of the run's selection a build holds: a nightly sharded over drivers and merged, or resumed
    after its driver died, is covered whole only when every selected case has a result."""

    kind: str
    stored: int
    selected: int

    @property
    def missing(self) -> int:
        return max(0, self.selected - self.stored)

    def __str__(self) -> str:
        if not self.missing:
            return f"all {self.selected:,} selected {self.kind} cases"
        return (f"{self.stored:,} of {self.selected:,} selected {self.kind} cases: {self.missing:,} missing "
                "(a shard not merged, or a run not finished: --resume completes it)")


def completeness(rows: Iterable, manifest: dict | None) -> Completeness | None:
    """The build's results of the kind its run selected against the size of that selection (recorded in the
    build's manifest by the suite commands); None for a build that did not record one."""
    selection = (manifest or {}).get("selection") or {}
    kind, selected = selection.get("kind"), selection.get("cases")
    if not kind or not isinstance(selected, int):
        return None
    return Completeness(kind=kind, stored=sum(1 for r in rows if r.kind == kind), selected=selected)


@dataclass(slots=True, kw_only=True)
class Headline:
    ops: Rate
    op_cases: Rate
    families: list[FamilyCoverage]
    counts: dict[str, int]
    verdicts: dict[str, dict[str, int]] = field(default_factory=dict)  # family -> verdict -> cases
    completeness: Completeness | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def headline(rows: list, manifest: dict | None = None) -> Headline:
    ops = [r for r in rows if r.kind == "op"]
    judged = [r for r in ops if r.status is not Status.SKIP]
    return Headline(
        ops=op_matrix(ops).pairs,
        op_cases=Rate(passed=sum(r.status is Status.PASS for r in judged), total=len(judged)),
        families=model_families(rows),
        counts=dict(Counter(r.status.value for r in rows)),
        verdicts=verdicts_by_family(rows),
        completeness=completeness(rows, manifest),
    )
