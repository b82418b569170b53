"""Writing real result rows into a real store, for tests that need builds the suite
cannot cheaply produce (model families, many builds, hostile names)."""

from __future__ import annotations

from conformance.case import Case
from conformance.outcome import Outcome, Status


def op(name: str, dtype: str = "float32", mode: str = "forward", variant: str = "") -> Case:
    return Case(kind="op", name=name, category=variant, dtype=dtype, mode=mode, config={"source": "opinfo"})


def model(family: str, name: str, mode: str, dtype: str = "float32") -> Case:
    return Case(kind="model", name=name, category=family, dtype=dtype, mode=mode, config={"arch": name})


def write_build(store, build_id: str, results: list[tuple[Case, str]], *, created: float | None = None,
                target: str = "neuron", messages: dict | None = None, repros: dict | None = None) -> None:
    """Records ``(case, status)`` pairs as build ``build_id``; failing ones get a message."""
    items = results
    manifest = {"target": target, "torch": "2.14.1", "emulator_profile": {"name": "exact"}, "env": {}}
    store.ensure_build(build_id, target=target, label=f"{target} (test)", manifest=manifest, created=created)
    for case, status in items:
        status = Status(status)
        message = (messages or {}).get(case.id) or ("" if status is Status.PASS else
                                                    f"sample 0: output: Mismatched elements: 3 / 10 (30.0%) in {case.name}")
        store.record(build_id, case, Outcome(case_id=case.id, status=status, message=message, duration_s=0.01,
                                             repro=(repros or {}).get(case.id)))
