"""A case's outcome from its samples' verdicts, and the cause its failing samples have in common."""

from __future__ import annotations

from typing import Any

from conformance.case import Case
from conformance.host_copies import HostCopies, HostExecution
from conformance.outcome import Outcome, Status
from diff.precision import PrecisionModel

from .causes import case_cause, sample_facts
from .judging import SampleVerdict


MAX_REPORTED_FAILURES = 10


SEVERITY = (Status.CRASH, Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED, Status.INCONCLUSIVE)


def aggregate(case, verdicts, worst, trace, timings, rule, nondeterministic, *, cached, host: HostCopies,
               precision: PrecisionModel | None = None) -> Outcome:
    """The case's outcome from its samples' verdicts. Host execution comes from two independent sources:
    the backend's own tracking (``trace.fallback``) and host<->device copies seen inside an op (``host``)."""
    by_status: dict[str, int] = {}
    for v in verdicts:
        by_status[v.status.value] = by_status.get(v.status.value, 0) + 1
    failures = [v for v in verdicts if v.status not in (Status.PASS, Status.SKIP)]
    evidence: dict[str, Any] = {
        "samples": len(verdicts),
        "by_status": by_status,
        "sample_statuses": [v.status.value for v in verdicts],  # in sample order
        "metrics": worst,
        "rule": rule.property or (rule.compare if not rule.gather else "gather_indices"),
        "failures": [
            {"sample": v.index, "status": v.status.value, "message": v.message,
             "mismatches": (v.comparison or {}).get("mismatches", [])[:3]}
            for v in failures[:MAX_REPORTED_FAILURES]
        ],
    }
    if nondeterministic:
        evidence["nondeterministic_reference_samples"] = nondeterministic
    within = [v for v in verdicts if v.status is Status.PASS and v.noise is not None]
    if precision:
        evidence["precision_model"] = precision.to_dict()
    if within:
        worst_bits = min(within, key=lambda v: v.noise["bits_kept"] - v.noise["bits_expected"])
        evidence["within_precision"] = {"samples": len(within), "model": precision.summary if precision else "",
                                        "worst": worst_bits.noise}
    skipped = sorted({v.message for v in verdicts if v.status is Status.SKIP})
    if skipped:
        evidence["skipped_samples"] = skipped[:3]  # why some samples could not be judged
    on_host = HostExecution(trace, host)
    on_host.record(evidence)
    status = Status.PASS
    message = f"{by_status.get('pass', 0)} / {len(verdicts)} samples match"
    for s in SEVERITY:
        hits = [v for v in failures if v.status is s]
        if hits:
            status = s
            message = f"sample {hits[0].index}: {hits[0].message}"
            if len(hits) > 1:
                message += f" (+{len(hits) - 1} more samples)"
            if s not in (Status.MISMATCH, Status.INCONCLUSIVE):
                evidence["error"] = hits[0].message
            break
    else:
        if not by_status.get("pass"):
            status = Status.SKIP
            reasons = sorted({v.message for v in verdicts})
            message = f"no sample could be judged: {reasons[0]}" if reasons else "no samples"
        elif on_host.ops:
            status = Status.CPU_FALLBACK
            message = on_host.fallback_message()
    if within and status in (Status.PASS, Status.CPU_FALLBACK):
        message += f"; {len(within)} of them {worst_bits.message}"
    if nondeterministic and status in (Status.PASS, Status.CPU_FALLBACK):
        message += (f" ({len(nondeterministic)} compared by metadata only: the CPU reference does not reproduce "
                    "its own result for them)")
    if status is Status.MISMATCH:
        message += on_host.mismatch_note()
    return Outcome(case_id=case.id, status=status, message=message, evidence=evidence, timings=timings,
                   cached_reference=cached)


def name_the_cause(case: Case, outcome: Outcome, samples, verdicts: list[SampleVerdict]) -> None:
    """Names what the failing samples have in common (op_tests/causes.py) in the outcome's evidence."""
    if outcome.status in (Status.PASS, Status.SKIP):
        return
    judged = [v for v in verdicts if v.status is not Status.SKIP]
    strategy = case.config.get("inputs", "")
    facts = [sample_facts(samples[v.index], strategy, case.name) for v in judged]
    failed = [v.status is not Status.PASS for v in judged]
    if outcome.status is Status.CPU_FALLBACK:
        failed = [True] * len(judged)
    cause = case_cause(facts, failed)
    if cause is not None:
        outcome.evidence["cause"] = cause.to_dict()
