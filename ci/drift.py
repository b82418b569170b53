"""Precision drift between builds: cases that still pass, but with a worst error grown by a factor.

A kernel change that makes softmax 50 times less accurate while it stays
within tolerance passes the gate, and is news to the backend team before it
becomes a failure. Every passing case with float outputs stores its worst
error against the CPU reference, over all samples and outputs (``max_ulp``,
in units in the last place of the output's dtype). Two builds' metrics are
comparable when the case id is the same (the same op, dtype, input strategy
and seed, so the same samples), the same number of samples was judged, and
the torch version is the same (OpInfo's samples change between versions).

A case drifts when its worst error grew by ``factor`` (4 by default: two
bits of agreement lost) or more, counting a bitwise-equal result as 1 ULP off
(so 0 to 3 ULP is no drift, and 0 to 4 ULP is). The gate reports drifts and
fails on them only when asked (``--fail-on-drift``); the dashboard shows them
with each drifting op's worst error over every build of the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_FACTOR = 4.0
ULP_FLOOR = 1.0  # a bitwise-equal result counts as this many ULP off, so growth from 0 has a finite factor


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    case_id: str
    title: str
    name: str  # the op (or model) name, which trends are kept by
    dtype: str
    before_ulp: float
    after_ulp: float

    @property
    def factor(self) -> float:
        return max(self.after_ulp, ULP_FLOOR) / max(self.before_ulp, ULP_FLOOR)

    @property
    def bits_lost(self) -> float:
        return math.log2(self.factor)

    def describe(self) -> str:
        return (f"{self.title}: worst error {self.before_ulp:.0f} -> {self.after_ulp:.0f} ULP "
                f"({self.factor:.1f}x, {self.bits_lost:.1f} bits of agreement lost)")


@dataclass(slots=True, kw_only=True)
class DriftReport:
    build: str
    baseline: str
    factor: float
    drifts: list[Drift] = field(default_factory=list)
    compared: int = 0  # cases with comparable metrics in both builds
    note: str = ""  # why nothing could be compared, when nothing could

    def __bool__(self) -> bool:
        return not self.drifts


def precision_drift(store, build: str, baseline: str, *, factor: float = DEFAULT_FACTOR) -> DriftReport:
    """Cases passing in both builds whose worst error grew by ``factor`` or more, worst first."""
    if not factor > 1:
        raise ValueError(f"drift factor {factor!r}: must be greater than 1")
    report = DriftReport(build=build, baseline=baseline, factor=factor)
    new_info, old_info = store.build(build), store.build(baseline)
    if new_info.torch_version != old_info.torch_version:
        report.note = (f"not comparable: torch {new_info.torch_version} against {old_info.torch_version} "
                       "(OpInfo's samples differ between versions)")
        return report
    now, before = store.precision(build), store.precision(baseline)
    for case_id, row in now.items():
        old = before.get(case_id)
        if old is None or old.samples != row.samples:
            continue
        report.compared += 1
        drift = Drift(case_id=case_id, title=row.title, name=row.name, dtype=row.dtype, before_ulp=old.max_ulp,
                      after_ulp=row.max_ulp)
        if drift.factor >= factor:
            report.drifts.append(drift)
    report.drifts.sort(key=lambda d: (-d.factor, d.title))
    return report


def precision_trend(store, ops: list[tuple[str, str]], builds: list[str]) -> dict[tuple[str, str], list]:
    """Per (op name, dtype): its worst error (max ULP over its passing cases) in each build, in ``builds``'
    order; None where the build has no passing case of it. Kept per dtype: an ULP of float16 is not one of
    float32."""
    trend: dict[tuple[str, str], list[float | None]] = {op: [] for op in ops}
    for build in builds:
        worst: dict[tuple[str, str], float] = {}
        for row in store.precision(build).values():
            key = (row.name, row.dtype)
            if key in trend:
                worst[key] = max(worst.get(key, 0.0), row.max_ulp)
        for key in ops:
            trend[key].append(worst.get(key))
    return trend
