"""Outcomes: the classified result of running one case on reference and target.

Like Polygraphy's result objects, an Outcome is truthy when the case passed,
carries its evidence (metrics, error text, ops that fell back to the host,
reproducer path) and saves and loads with a type tag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    MISMATCH = "mismatch"  # ran, computed something else
    ERROR = "error"  # raised on the target (and not on the reference)
    UNSUPPORTED = "unsupported"  # the target says it does not implement it
    CPU_FALLBACK = "cpu_fallback"  # right answer, but computed on the host
    CRASH = "crash"  # the worker process died
    TIMEOUT = "timeout"  # the case ran past its time limit
    SKIP = "skip"  # cannot be judged (e.g. fails on the reference too), with a reason
    INCONCLUSIVE = "inconclusive"  # ran, but the reference cannot decide it (not deterministic): never a pass
    XFAIL = "xfail"  # a known failure, from expectations
    XPASS = "xpass"  # a known failure that now passes

    def __str__(self) -> str:
        return self.value


# Evidence key: the CPU reference raised, so the case is a skip (the exception's text). A supervisor runs such a
# case again in a fresh worker before the skip stands (runner.supervisor).
REFERENCE_RAISED = "reference_raised"
# Evidence key: the float64 golden could not be run (the exception's line), so the judge decided against the
# reference alone. What refused it (the worker's memory cap, often: a float64 model is twice the float32 one) is
# the golden's, not the case's: the verdict stands (runner.worker).
GOLDEN_ERROR = "golden_error"

PASSING = frozenset({Status.PASS, Status.XFAIL, Status.XPASS, Status.SKIP})
FAILING = frozenset({Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED, Status.CPU_FALLBACK, Status.CRASH, Status.TIMEOUT})


@dataclass(kw_only=True)
class Outcome:
    case_id: str
    status: Status
    message: str = ""  # one line, what a person reads first
    evidence: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # generation / execution / comparison
    repro: str | None = None
    cached_reference: bool = False

    TYPE_TAG = "neuron_validate.Outcome/1"

    def __bool__(self) -> bool:
        return self.status is Status.PASS

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    def to_dict(self) -> dict:
        return {
            "type": self.TYPE_TAG,
            "case_id": self.case_id,
            "status": self.status.value,
            "message": self.message,
            "evidence": self.evidence,
            "duration_s": self.duration_s,
            "timings": self.timings,
            "repro": self.repro,
            "cached_reference": self.cached_reference,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        if d.get("type") != cls.TYPE_TAG:
            raise ValueError(f"not an Outcome record: type={d.get('type')!r}")
        return cls(
            case_id=d["case_id"],
            status=Status(d["status"]),
            message=d.get("message", ""),
            evidence=d.get("evidence", {}),
            duration_s=float(d.get("duration_s", 0.0)),
            timings=dict(d.get("timings", {})),
            repro=d.get("repro"),
            cached_reference=bool(d.get("cached_reference", False)),
        )
