"""Findings and the verdict they add up to.

Every check yields findings of one of three severities. Any ``error`` makes
the verdict ``not ready`` (exit code 1), any ``warning`` ``ready with
warnings`` (exit 0), otherwise ``ready`` (exit 0). A finding is keyed by its
check and subject so that two reports can be compared finding by finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("error", "warning", "info")
READY = "ready"
READY_WITH_WARNINGS = "ready with warnings"
NOT_READY = "not ready"
VERDICTS = (READY, READY_WITH_WARNINGS, NOT_READY)
EXIT_CODES = {READY: 0, READY_WITH_WARNINGS: 0, NOT_READY: 1}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One observation about the migration: what, how bad, where in the user's code, and what to do."""

    check: str  # runs | numerics | host-fallback | placement | recompilation | wide-dtypes | loss-curves | speed | ...
    severity: str
    title: str
    subject: str = ""  # what the finding is about (an op, a module, a line): part of its key
    where: str | None = None
    detail: str = ""
    hint: str = ""
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r} (type=str): expected one of {', '.join(SEVERITIES)}")

    @property
    def key(self) -> str:
        return f"{self.check}:{self.subject}" if self.subject else self.check

    def to_dict(self) -> dict:
        return {"key": self.key, "check": self.check, "severity": self.severity, "title": self.title,
                "subject": self.subject, "where": self.where, "detail": self.detail, "hint": self.hint,
                "data": self.data}

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        return cls(check=data["check"], severity=data["severity"], title=data["title"],
                   subject=data.get("subject", ""), where=data.get("where"), detail=data.get("detail", ""),
                   hint=data.get("hint", ""), data=data.get("data", {}))


def verdict_of(findings: list[Finding]) -> str:
    severities = {f.severity for f in findings}
    if "error" in severities:
        return NOT_READY
    if "warning" in severities:
        return READY_WITH_WARNINGS
    return READY


def rank(verdict: str) -> int:
    """0 ready, 1 ready with warnings, 2 not ready: larger is worse."""
    return VERDICTS.index(verdict)
