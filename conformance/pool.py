"""The local executor: a pool of worker processes with crash, hang and memory
isolation.

A segfault in one op must not end a sweep (a public out-of-tree backend lost a
whole op_db run at 93% that way). Each case runs in a long-lived worker; when
the worker dies, exceeds the per-case timeout or grows past the RSS cap, that
case is marked ``crash`` or ``timeout`` with its evidence, the worker is
replaced and the run goes on. The replacement worker also writes the dead
case's reproducer, since the dead one cannot.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Iterable, Iterator

from .case import Case
from .outcome import Outcome, Status
from .settings import RunSettings
from .worker import RECYCLE_FRACTION, worker_main

# An idle persistent worker above RECYCLE_FRACTION of the RSS cap is replaced between cases: the allocator
# keeps freed memory, and a big model would otherwise push an innocent later case over the cap.
POLL_S = 0.25
WORKER_START_TIMEOUT_S = 180.0


class ExecutorError(RuntimeError):
    """The executor itself cannot run (e.g. workers fail to start)."""


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


@dataclass
class _Worker:
    process: mp.Process
    conn: Connection
    ready: bool = False
    case: Case | None = None
    started: float = 0.0
    spawned: float = field(default_factory=time.monotonic)
    pending_repro: list = field(default_factory=list)


def _reference_at_fault(outcome: Outcome, how: str) -> Outcome:
    """The reference alone also crashed or hung: the case cannot be judged (a skip, with the evidence)."""
    return Outcome(
        case_id=outcome.case_id,
        status=Status.SKIP,
        message=f"the CPU reference alone also {how} on this case, so the target cannot be judged "
                f"(target outcome: {outcome.status.value}: {outcome.message})",
        evidence={**outcome.evidence, "target_status": outcome.status.value, "reference_at_fault": True},
        duration_s=outcome.duration_s,
    )


class LocalPool:
    """Runs cases on ``jobs`` worker processes and yields Outcomes as they finish."""

    def __init__(self, settings: RunSettings, jobs: int = 1, *, persistent: bool = False) -> None:
        """``persistent``: keep the workers between ``run`` calls (until ``close``), as the pytest route does."""
        if jobs < 1:
            raise ValueError(f"jobs={jobs!r} (type=int): must be >= 1")
        self.settings = settings
        self.jobs = jobs
        self.persistent = persistent
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []

    # ---------------------------------------------------------------- workers
    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=worker_main, args=(child, self.settings), daemon=True)
        process.start()
        child.close()
        return _Worker(process=process, conn=parent)

    def _kill(self, worker: _Worker) -> None:
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(timeout=10)
        worker.conn.close()

    def close(self) -> None:
        for w in self._workers:
            try:
                if w.process.is_alive() and w.case is None:
                    w.conn.send(None)
                    w.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
            self._kill(w)
        self._workers = []

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _rss_mb(self, worker: _Worker) -> float:
        try:
            import psutil

            return psutil.Process(worker.process.pid).memory_info().rss / 2**20
        except Exception:  # noqa: BLE001 - the process may be gone
            return 0.0

    # ---------------------------------------------------------------- run
    def run(self, cases: Iterable[Case]) -> Iterator[Outcome]:
        queue: deque[Case] = deque(cases)
        if not queue:
            return
        while len(self._workers) < min(self.jobs, len(queue)):
            self._workers.append(self._spawn())
        try:
            yield from self._loop(queue)
        finally:
            if not self.persistent:
                self.close()

    def run_one(self, case: Case) -> Outcome:
        """Runs a single case (with the same isolation) and returns its outcome."""
        outcomes = list(self.run([case]))
        return outcomes[-1]

    def _replace(self, worker: _Worker) -> _Worker:
        self._kill(worker)
        fresh = self._spawn()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    def _loop(self, queue: deque[Case]) -> Iterator[Outcome]:
        repro_queue: deque[tuple[Case, Outcome]] = deque()
        waiting_repro: dict[int, tuple[Case, Outcome]] = {}
        probed: set[int] = set()  # workers whose reference probe finished (the reference survived)
        while queue or any(w.case is not None for w in self._workers) or waiting_repro or repro_queue:
            # Hand out work to idle, ready workers: reproducers of dead cases first.
            for w in self._workers:
                if not w.ready or w.case is not None or id(w) in waiting_repro:
                    continue
                if repro_queue:
                    case, outcome = repro_queue.popleft()
                    w.conn.send(("repro", case.to_dict(), outcome.to_dict()))
                    waiting_repro[id(w)] = (case, outcome)
                    w.started = time.monotonic()
                elif queue:
                    w.case = queue.popleft()
                    w.started = time.monotonic()
                    w.conn.send(("run", w.case.to_dict()))
            conns = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
            ready = wait(conns, timeout=POLL_S)
            now = time.monotonic()
            for w in list(self._workers):
                if w.conn in ready:
                    try:
                        message = w.conn.recv()
                    except (EOFError, OSError):
                        message = None
                    if message is not None:
                        verb = message[0]
                        if verb == "ready":
                            w.ready = True
                        elif verb == "fatal":
                            raise ExecutorError(f"worker failed to start: {message[1]}")
                        elif verb == "done":
                            outcome = Outcome.from_dict(message[1])
                            w.case = None
                            if self._rss_mb(w) > self.settings.rss_limit_mb * RECYCLE_FRACTION:
                                self._replace(w)  # memory kept from earlier cases must not fail the next one
                            yield outcome
                        elif verb == "probed":
                            probed.add(id(w))
                        elif verb == "repro":
                            probed.discard(id(w))
                            case, outcome = waiting_repro.pop(id(w))
                            outcome.repro = message[1]
                            if message[2]:
                                outcome.evidence["repro_error"] = message[2]
                            yield outcome
                        continue
                if not w.process.is_alive():
                    yield from self._on_death(w, repro_queue, waiting_repro, probed, now)
                    continue
                if id(w) in waiting_repro and now - w.started > self.settings.timeout_s:
                    case, outcome = waiting_repro.pop(id(w))
                    if id(w) in probed:
                        outcome.evidence["repro_error"] = "writing the reproducer timed out"
                    else:
                        outcome = _reference_at_fault(outcome, "hangs")
                    probed.discard(id(w))
                    self._replace(w)
                    yield outcome
                    continue
                if id(w) in waiting_repro:
                    rss = self._rss_mb(w)
                    if rss > self.settings.rss_limit_mb:  # probes and reproducers obey the cap too
                        case, outcome = waiting_repro.pop(id(w))
                        if id(w) in probed:
                            outcome.evidence["repro_error"] = f"writing the reproducer exceeded the RSS cap ({rss:.0f} MiB)"
                        else:
                            outcome = _reference_at_fault(outcome, f"exceeds the RSS cap ({rss:.0f} MiB)")
                        probed.discard(id(w))
                        self._replace(w)
                        yield outcome
                        continue
                if not w.ready and now - w.spawned > WORKER_START_TIMEOUT_S:
                    raise ExecutorError(f"worker did not start within {WORKER_START_TIMEOUT_S:.0f} s")
                if w.case is not None:
                    elapsed = now - w.started
                    if elapsed > self.settings.timeout_s:
                        case = w.case
                        outcome = Outcome(
                            case_id=case.id,
                            status=Status.TIMEOUT,
                            message=f"timed out after {self.settings.timeout_s:g} s; the worker was stopped",
                            evidence={"timeout_s": self.settings.timeout_s},
                            duration_s=elapsed,
                        )
                        self._replace(w)
                        repro_queue.append((case, outcome))
                        continue
                    rss = self._rss_mb(w)
                    if rss > self.settings.rss_limit_mb:
                        case = w.case
                        outcome = Outcome(
                            case_id=case.id,
                            status=Status.CRASH,
                            message=f"worker exceeded the RSS cap: {rss:.0f} MiB > {self.settings.rss_limit_mb} MiB",
                            evidence={"rss_mb": rss, "rss_limit_mb": self.settings.rss_limit_mb},
                            duration_s=elapsed,
                        )
                        self._replace(w)
                        repro_queue.append((case, outcome))

    def _on_death(self, w: _Worker, repro_queue, waiting_repro, probed, now) -> Iterator[Outcome]:
        exitcode = w.process.exitcode
        pending = waiting_repro.pop(id(w), None)
        if pending is not None:
            case, outcome = pending
            if id(w) in probed:  # died while writing the reproducer: give up on that reproducer
                outcome.evidence["repro_error"] = f"reproducer writer died: {_signal_name(exitcode)}"
            else:  # died running the reference alone: the CPU reference is at fault
                outcome = _reference_at_fault(outcome, f"dies ({_signal_name(exitcode)})")
            probed.discard(id(w))
            yield outcome
        if w.case is not None:
            case = w.case
            outcome = Outcome(
                case_id=case.id,
                status=Status.CRASH,
                message=f"worker process died: {_signal_name(exitcode)}",
                evidence={"exitcode": exitcode, "signal": _signal_name(exitcode)},
                duration_s=now - w.started,
            )
            repro_queue.append((case, outcome))
        elif not w.ready:
            raise ExecutorError(f"worker died while starting: {_signal_name(exitcode)}")
        self._replace(w)
