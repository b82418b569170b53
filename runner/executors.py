"""Case kinds and their executors, found through entry points.

A kind of case (``op``, ``model``, ``script``, ...) brings an executor: how a
worker runs one case of that kind, how it runs only the reference side (the
probe that tells "the CPU fails too" from a target fault), how it writes a
reproducer, and what a worker loads before its first case. A package declares
its executor in ``pyproject.toml``, as pytest plugins declare themselves::

    [project.entry-points."neuron_validate.executors"]
    op = "op_tests.execute:EXECUTOR"

so the runner never imports the packages that provide cases, and a new kind
adds an executor, never a new way to spawn processes.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Callable

from conformance.case import Case
from conformance.outcome import Outcome

ENTRY_POINT_GROUP = "neuron_validate.executors"


class UnknownKind(LookupError):
    """No installed package provides an executor for this kind of case."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Executor:
    """What a worker needs to run cases of one kind."""

    kind: str
    # Each function gets the case and the worker's context (runner.worker.WorkerContext).
    execute: Callable[[Case, object], Outcome]
    # Runs only the reference side; raises (or dies) when the reference cannot run the case alone.
    probe_reference: Callable[[Case, object], None] | None = None
    # Writes a reproducer for a failing outcome; returns its path.
    write_repro: Callable[[Case, Outcome, object], str | None] | None = None
    # Loads what every case of the kind needs (op_db, ...), so a case's timeout measures the case.
    warmup: Callable[[], None] | None = None
    # Whether a worker resolves the run's target and reference before it reports ready, so that a
    # missing device stops the run at once, in one line. A side of a user script does not: its CPU side
    # must never register the target device.
    resolves_targets: bool = True
    # Whether the case's warnings print as they would without the harness (a user script's side: its output
    # file is the user's to read). Other kinds' warnings are counted into the outcome's evidence instead.
    shows_warnings: bool = False


def _entry_points() -> dict[str, object]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


@functools.cache
def executor_for(kind: str) -> Executor:
    points = _entry_points()
    if kind not in points:
        if not points:
            raise UnknownKind(f"no case executors are installed (entry point group {ENTRY_POINT_GROUP!r}): install "
                              "neuron-validate with pip install --no-build-isolation -e .")
        close = difflib.get_close_matches(kind, list(points), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UnknownKind(f"kind={kind!r} (type=str): no executor for this kind of case{hint} "
                          f"(kinds: {', '.join(sorted(points))})")
    executor = points[kind].load()
    if not isinstance(executor, Executor) or executor.kind != kind:
        raise UnknownKind(f"entry point {kind} = {points[kind].value} is not the Executor of kind {kind!r}")
    return executor


def installed_kinds() -> tuple[str, ...]:
    return tuple(sorted(_entry_points()))
