"""What the store's reads return: builds, full results, cheap status rows and reruns."""

from __future__ import annotations

import json
from dataclasses import dataclass

from conformance.case import Case
from conformance.outcome import Outcome, Status


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildInfo:
    id: str
    target: str
    label: str
    backend_version: str | None
    torch_version: str | None
    manifest: dict
    created: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRow:
    build_id: str
    case: Case
    title: str
    outcome: Outcome


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRow:
    """One result without its evidence: what summaries over many builds need, cheaply."""

    case_id: str
    kind: str
    category: str
    name: str
    dtype: str
    mode: str
    title: str
    status: Status
    message: str
    duration: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionRow:
    """A passing case's worst error against the reference, as its outcome's metrics recorded it: what precision
    drift between builds is measured on (same case id: same samples, same seed)."""

    case_id: str
    name: str
    category: str
    dtype: str
    mode: str
    title: str
    max_ulp: float  # worst over samples and outputs, in units in the last place of the output's dtype
    max_rel: float
    samples: int  # how many samples were judged; metrics of different counts are not comparable


@dataclass(frozen=True, slots=True, kw_only=True)
class RerunRow:
    build_id: str
    case_id: str
    attempt: int
    outcome: Outcome


# The columns that rebuild a Case, in the order case_from_columns takes them.
CASE_COLUMNS = "c.kind, c.name, c.category, c.dtype, c.mode, c.config, c.seed"


def case_from_columns(kind: str, name: str, category: str, dtype: str, mode: str, config: str, seed: int) -> Case:
    """The Case a row of ``cases`` records (selected as :data:`CASE_COLUMNS`)."""
    return Case(kind=kind, name=name, category=category, dtype=dtype, mode=mode, config=json.loads(config), seed=seed)


def build_from_row(row: tuple) -> BuildInfo:
    """A row of ``builds`` (``SELECT *``)."""
    return BuildInfo(id=row[0], target=row[1], label=row[2], backend_version=row[3], torch_version=row[4],
                     manifest=json.loads(row[5]), created=row[6])
