"""A case's journal: the step a worker had in flight when it died, so that the case can resume past it.

A compiler that segfaults on one graph takes its worker with it, and with it every verdict of the case. An
executor that can isolate such a step (op cases compile their samples in batches: op_tests/run.py) writes the
step's samples here before it starts it and clears them after. When the worker dies with a step in flight,
the supervisor records the death against those samples (:meth:`CaseJournal.crashed_now`) and runs the case
again; the executor then splits a batch that died down to the samples responsible, and reports a sample that
died alone as a ``crash`` of its own, judging every other sample as usual. A worker that dies in a step of the
CPU's own (the reference, its float64 golden, its reruns) died of the CPU: the case cannot be judged, whether
or not the reference dies again when run alone (a kernel that reads uninitialised memory may not).

The journal is a small JSON file per case in the run's crash folder (the supervisor's, shared with its
workers); it is removed when the case completes. Where no folder is shared (a remote worker), nothing is
resumed and the case's crash stands, as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TARGET, CPU = "target", "cpu"  # kinds of step
MAX_RESUMES = 12  # deaths of one case's worker resumed past; then the case's crash stands (a bisection of 48: 7)


class CaseJournal:
    def __init__(self, folder: str | os.PathLike | None, case_id: str) -> None:
        self.path = Path(folder) / f"journal-{case_id}.json" if folder else None
        self._state = self._read()

    def _read(self) -> dict:
        if self.path is None:
            return {}
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _write(self) -> None:
        if self.path is None:
            return
        try:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._state))
            os.replace(tmp, self.path)
        except OSError:  # a vanished folder: the step is simply not resumable
            pass

    # ---------------------------------------------------------------- the executor's side
    def crashed(self, kind: str = TARGET) -> list[tuple[list[int], str]]:
        """Steps of this kind that killed a worker before: (their samples, the death's reason)."""
        return [(list(e["samples"]), e["reason"]) for e in self._state.get("crashed", [])
                if e.get("kind", TARGET) == kind]

    def begin(self, samples: list[int], kind: str = TARGET) -> None:
        """The step about to start, with the samples it runs; ``kind``: TARGET (resumable) or CPU (the reference's
        own step: a death there is the CPU's, never the target's)."""
        if self.path is not None:
            self._state["in_flight"] = {"samples": list(samples), "kind": kind}
            self._write()

    def end(self) -> None:
        if self.path is not None and self._state.get("in_flight") is not None:
            self._state["in_flight"] = None
            self._write()

    def close(self) -> None:
        """The case completed: nothing to resume."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    # ---------------------------------------------------------------- the supervisor's side
    def in_flight(self) -> dict | None:
        """The step the worker was in when it died: {"samples": [...], "kind": TARGET | CPU}, or None."""
        step = self._state.get("in_flight")
        return step if isinstance(step, dict) else None

    def crashed_now(self, reason: str) -> bool:
        """The worker died in a target step: records it as crashed; True when the case should run again."""
        step = self.in_flight()
        if step is None or step["kind"] != TARGET or len(self._state.get("crashed", [])) >= MAX_RESUMES:
            return False
        self._state.setdefault("crashed", []).append({**step, "reason": reason})
        self._state["in_flight"] = None
        self._write()
        return True
