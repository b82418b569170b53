"""Failures grouped by cause: one line per root cause, not one per case.

A stride bug in ``exp`` fails 18 cases (12 dtypes, forward and backward,
OpInfo samples and input strategies); a gate that lists 36 regressions from
two bugs hides both. A group is one op (or model) and one cause:

- for op cases, the cause the op executor named in the outcome's evidence
  (op_tests/causes.py: what every failing sample has and the passing ones
  lack, "non-contiguous inputs", "rows longer than 128"), whatever the
  status each case ended with;
- otherwise (a crash, a hang, a model, a script, or op failures with no
  telling fact), the status and the error message with its particulars
  taken out (:func:`error_signature`).

The gate, the terminal summary and the dashboard all group with
:func:`group_failures`, so they agree.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_PATH = re.compile(r"(?:/[\w.-]+){2,}")
_TUPLE = re.compile(r"\((?:N,\s*)+N?\)")
_MORE = re.compile(r"\s*\(\+N more samples?\)")
_SPEC = re.compile(r"\s*\[TensorSpec\(.*?\)\]")
_SAMPLE_NAME = re.compile(r"\s*\[[^\[\]]*\]")
_SPACE = re.compile(r"\s+")
SIGNATURE_CHARS = 160
GENERIC_CAUSES = ("all", "some")  # op causes that name no fact: grouped by status and message instead

WHAT = {
    "mismatch": "wrong results",
    "error": "errors",
    "unsupported": "unsupported",
    "cpu_fallback": "runs on the host",
    "crash": "crashes",
    "timeout": "hangs",
    "inconclusive": "cannot be judged",
}


def error_signature(message: str) -> str:
    """A message with its particulars (numbers, addresses, paths, sample indices and names) taken out, so
    that failures with one cause group together: "sample 3: ... 37 / 4096 ..." and "sample 0: ... 2 / 9 ..."
    are the same error."""
    text = (message or "").strip().splitlines()[0] if message else ""
    text = re.sub(r"^sample \d+:\s*", "", text)
    text = _SPEC.sub("", text)
    text = _SAMPLE_NAME.sub("", text)
    text = _HEX.sub("ADDR", text)
    text = _PATH.sub("…", text)
    text = _NUMBER.sub("N", text)
    text = _TUPLE.sub("(…)", text)
    text = _MORE.sub("", text)
    text = text.split(";")[0].replace("ADDR", "0x…")
    text = _SPACE.sub(" ", text).strip()
    return text[:SIGNATURE_CHARS] or "(no message)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One failing case, as grouping needs it (from a result row or from the gate's comparison)."""

    case: object  # conformance.case.Case
    case_id: str
    title: str
    status: str
    message: str
    cause: dict | None = None  # the op executor's evidence["cause"]
    repro: str | None = None  # as stored


@dataclass(slots=True, kw_only=True)
class FailureGroup:
    name: str  # op key, or category/name for other kinds
    cause: str  # what the failing inputs share, or the error signature
    key: tuple
    named: bool = True  # the cause is a fact about the inputs; False: it is an error message
    members: list[Failure] = field(default_factory=list)
    repro: str | None = None  # the smallest reproducer of the group, as stored
    repro_bytes: int | None = None

    @property
    def statuses(self) -> Counter:
        return Counter(m.status for m in self.members)

    @property
    def dtypes(self) -> list[str]:
        return sorted({m.case.dtype for m in self.members if m.case.dtype})

    @property
    def modes(self) -> list[str]:
        return sorted({m.case.mode for m in self.members if m.case.mode})

    @property
    def what(self) -> str:
        statuses = self.statuses
        if len(statuses) == 1:
            return WHAT.get(next(iter(statuses)), next(iter(statuses)))
        return "failures (" + ", ".join(f"{n} {s}" for s, n in statuses.most_common()) + ")"

    @property
    def headline(self) -> str:
        n = len(self.members)
        spread = f"{n} case{'s' if n != 1 else ''}"
        if len(self.dtypes) > 1:
            spread += f" across {len(self.dtypes)} dtypes"
        elif self.dtypes:
            spread += f" in {self.dtypes[0]}"
        if self.modes:
            spread += f" ({', '.join(self.modes)})"
        if self.named:
            return f"{self.name}: {self.what} for {self.cause}, {spread}"
        return f"{self.name}: {self.what}, {spread}: {self.cause}"


def failure_name(case) -> str:
    if case.kind == "op":
        return f"{case.name}.{case.category}" if case.category else case.name
    return f"{case.category}/{case.name}" if case.category else case.name


def _key_and_cause(f: Failure) -> tuple[tuple, str]:
    name = failure_name(f.case)
    cause = f.cause or {}
    if cause.get("key") and cause["key"] not in GENERIC_CAUSES:
        return (name, "cause", cause["key"]), cause.get("text") or cause["key"]
    signature = error_signature(f.message)
    prefix = f"{cause['text']}: " if cause.get("text") else ""
    return (name, f.status, signature), f"{prefix}{signature}"


def group_failures(failures: Iterable[Failure], *, repro_size: Callable[[str], int | None] | None = None
                   ) -> list[FailureGroup]:
    """Groups, largest first; each names its smallest reproducer (by ``repro_size``, else the first one)."""
    groups: dict[tuple, FailureGroup] = {}
    for f in failures:
        key, cause = _key_and_cause(f)
        group = groups.get(key)
        if group is None:
            group = groups[key] = FailureGroup(name=key[0], cause=cause, key=key, named=key[1] == "cause")
        group.members.append(f)
    for group in groups.values():
        best = None
        for m in group.members:
            if not m.repro:
                continue
            size = repro_size(m.repro) if repro_size else None
            rank = (size is None, size or 0)
            if best is None or rank < best[0]:
                best = (rank, m.repro, size)
        if best is not None:
            group.repro, group.repro_bytes = best[1], best[2]
    return sorted(groups.values(), key=lambda g: (-len(g.members), g.name, g.cause))


def failures_from_rows(rows) -> list[Failure]:
    """Failures of a build from the store's full result rows (results.store.ResultRow)."""
    from conformance.outcome import FAILING

    return [Failure(case=r.case, case_id=r.outcome.case_id, title=r.title, status=r.outcome.status.value,
                    message=r.outcome.message, cause=r.outcome.evidence.get("cause"), repro=r.outcome.repro)
            for r in rows if r.outcome.status in FAILING]
