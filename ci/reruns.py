"""Reruns in fresh processes: the gate's test for flakiness, and its reproducers.

The local pool keeps workers alive across cases, which is what makes a sweep
fast; a rerun wants the opposite. A fault that strikes some processes and not
others (a race in the runtime, a device left in a bad state, the emulator's
``p=`` faults) is told apart from a real regression only by running the case
again in a process that shares nothing with the one that failed. So each job
here gets a process of its own, with the same crash and timeout isolation as
the pool. The process that saw a failure also writes its reproducer (the
worker's ``execute`` does so for every failing case), with the very
environment that failed.

Reruns rebuild the build's environment from its manifest (target, reference,
backend modules, and the environment variables that shape the backend), not
from the gate's own environment: the gate judges the build that was recorded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import time
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Iterator

from conformance.case import Case
from conformance.outcome import Outcome, Status
from conformance.pool import POLL_S, WORKER_START_TIMEOUT_S, ExecutorError, _signal_name
from conformance.settings import EMULATOR_ENV, RunSettings

# Environment variables that place a process on a machine's devices rather than
# shape the backend's behaviour: a rerun takes the gate machine's own.
PLACEMENT_ENV = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True, slots=True, kw_only=True)
class FreshJob:
    """Run ``case`` (a failing run writes its reproducer), or, given ``outcome``, only write
    the reproducer of that outcome (for a case whose every run crashed before writing one)."""

    case: Case
    attempt: int = 0
    outcome: Outcome | None = None


def slug(text: str) -> str:
    """A folder name for a build id (ids are user input: no separators, no '..')."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "build"


def settings_for_build(manifest: dict, *, timeout_s: float, artifacts_dir: str | None,
                       rss_limit_mb: int = 4096) -> RunSettings:
    """RunSettings that rerun a build's cases the way the build ran them."""
    env = {k: "" for k in EMULATOR_ENV}  # unset in the build: unset in the rerun, whatever the gate has
    env.update({k: v for k, v in manifest.get("env", {}).items() if k not in PLACEMENT_ENV})
    env.pop("NEURON_VALIDATE_BACKEND_MODULES", None)
    reference = manifest.get("reference", {})
    return RunSettings(
        target=manifest.get("target", "neuron"),
        reference=reference.get("target", "cpu") if isinstance(reference, dict) else "cpu",
        backend_modules=tuple(manifest.get("backend_modules", ())),
        timeout_s=timeout_s,
        rss_limit_mb=rss_limit_mb,
        artifacts_dir=artifacts_dir,
        env=env,
    )


def _fresh_main(conn, settings: RunSettings, job: dict) -> None:
    """Entry point of one fresh process: one job, then exit."""
    os.environ.update(settings.worker_env())
    from conformance.worker import execute, make_context, write_repro

    try:
        ctx = make_context(settings)
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    case = Case.from_dict(job["case"])
    if job["outcome"] is None:
        outcome = execute(case, ctx)
    else:
        outcome = Outcome.from_dict(job["outcome"])
        try:
            outcome.repro = write_repro(case, outcome, ctx)
        except Exception as exc:  # noqa: BLE001 - a failed reproducer must not hide the outcome
            outcome.evidence["repro_error"] = f"{type(exc).__name__}: {exc}"
            outcome.evidence["repro_traceback"] = traceback.format_exc()
    conn.send(("done", outcome.to_dict()))


@dataclass(slots=True)
class _Running:
    job: FreshJob
    process: mp.Process
    conn: object
    spawned: float
    started: float | None = None  # when the case began (after the process was ready)


class FreshProcessRunner:
    """Runs each job in a new process, ``jobs`` at a time, and yields (job, outcome) as they finish."""

    def __init__(self, settings: RunSettings, *, jobs: int = 1) -> None:
        if jobs < 1:
            raise ValueError(f"jobs={jobs!r} (type=int): must be >= 1")
        self.settings = settings
        self.jobs = jobs
        self._ctx = mp.get_context("spawn")

    def _start(self, job: FreshJob) -> _Running:
        parent, child = self._ctx.Pipe()
        payload = {"case": job.case.to_dict(), "outcome": job.outcome.to_dict() if job.outcome else None}
        process = self._ctx.Process(target=_fresh_main, args=(child, self.settings, payload), daemon=True)
        process.start()
        child.close()
        return _Running(job=job, process=process, conn=parent, spawned=time.monotonic())

    @staticmethod
    def _stop(r: _Running) -> None:
        if r.process.is_alive():
            r.process.kill()
        r.process.join(timeout=10)
        r.conn.close()

    def run(self, queue: deque[FreshJob]) -> Iterator[tuple[FreshJob, Outcome]]:
        """Takes jobs from ``queue``; the caller may append follow-up jobs while iterating."""
        running: list[_Running] = []
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    running.append(self._start(queue.popleft()))
                ready = wait([r.conn for r in running] + [r.process.sentinel for r in running], timeout=POLL_S)
                now = time.monotonic()
                for r in list(running):
                    outcome = self._poll(r, ready, now)
                    if outcome is not None:
                        running.remove(r)
                        self._stop(r)
                        yield r.job, outcome
        finally:
            for r in running:
                self._stop(r)

    def _poll(self, r: _Running, ready, now: float) -> Outcome | None:
        case = r.job.case
        if r.conn in ready:
            try:
                message = r.conn.recv()
            except (EOFError, OSError):
                message = None
            if message is not None:
                verb, payload = message
                if verb == "ready":
                    r.started = now
                    return None
                if verb == "fatal":
                    raise ExecutorError(f"rerun process failed to start: {payload}")
                return Outcome.from_dict(payload)
        if not r.process.is_alive():
            r.process.join(timeout=1)
            if r.started is None:
                raise ExecutorError(f"rerun process died while starting: {_signal_name(r.process.exitcode)}")
            if r.job.outcome is not None:  # the reproducer writer died: keep the outcome, say why
                outcome = r.job.outcome
                outcome.evidence["repro_error"] = f"reproducer writer died: {_signal_name(r.process.exitcode)}"
                return outcome
            return Outcome(case_id=case.id, status=Status.CRASH,
                           message=f"worker process died: {_signal_name(r.process.exitcode)}",
                           evidence={"exitcode": r.process.exitcode, "signal": _signal_name(r.process.exitcode)},
                           duration_s=now - r.started)
        if r.started is None:
            if now - r.spawned > WORKER_START_TIMEOUT_S:
                raise ExecutorError(f"rerun process did not start within {WORKER_START_TIMEOUT_S:.0f} s")
            return None
        elapsed = now - r.started
        if elapsed > self.settings.timeout_s:
            if r.job.outcome is not None:
                outcome = r.job.outcome
                outcome.evidence["repro_error"] = "writing the reproducer timed out"
                return outcome
            return Outcome(case_id=case.id, status=Status.TIMEOUT,
                           message=f"timed out after {self.settings.timeout_s:g} s; the worker was stopped",
                           evidence={"timeout_s": self.settings.timeout_s}, duration_s=elapsed)
        rss = _rss_mb(r.process.pid)
        if rss > self.settings.rss_limit_mb and r.job.outcome is None:
            return Outcome(case_id=case.id, status=Status.CRASH,
                           message=f"worker exceeded the RSS cap: {rss:.0f} MiB > {self.settings.rss_limit_mb} MiB",
                           evidence={"rss_mb": rss, "rss_limit_mb": self.settings.rss_limit_mb}, duration_s=elapsed)
        return None


def _rss_mb(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss / 2**20
    except Exception:  # noqa: BLE001 - the process may be gone
        return 0.0
