"""One supervisor for isolated execution: a case goes in, an Outcome comes out.

A segfault in one op must not end a sweep (a public out-of-tree backend lost
a whole op_db run at 93% that way). Every case runs in a worker process, and
this module alone decides what happens when that goes wrong, whatever the
transport (a pool of long-lived local workers, Ray actors, or a fresh
process per case):

- **timeout**: a case past ``settings.timeout_s`` is ``timeout``; its worker is stopped;
- **crash**: a worker that dies makes its case a ``crash`` naming the signal
  (from the exit status, or from the worker's fault-handler log where the
  transport cannot tell), with the Python stack at the fault as evidence;
- **memory**: the worker's hard cap (``runner.worker``) turns a case that
  needs more memory than ``settings.rss_limit_mb`` into a ``crash`` saying so;
- **replacement**: a dead, stopped or bloated worker is replaced and the run goes on;
- **resumed steps**: a worker that dies while its case's journal (conformance/journal.py) names a step in
  flight (a compiler that segfaults on one batch of samples) runs the case again, and the executor resumes
  past that step; the samples that died alone are the case's ``crash``, the others are judged. One that dies
  in a step of the CPU's own (the reference, its golden, its reruns) is the CPU's crash: a ``skip``, as below;
- **reference probe**: after a crash, timeout or memory overrun another
  worker runs the case's reference side alone; when that dies, hangs or
  overruns too, the CPU reference is at fault and the case is a ``skip``
  with the target's outcome as evidence; otherwise that worker writes the
  dead case's reproducer, since the dead one cannot;
- **sides apart**: a memory overrun whose reference alone fits runs again in
  a worker given the reference's own share on top of the cap, so the target
  keeps the whole cap; only an overrun there is charged to the backend. So
  does a capped worker that died of a fault signal (a library that does not
  check an allocation segfaults under the cap): only dying again apart is a
  ``crash``. Where the target overran and the reference then ran to the end
  in the same worker, the executor measured the reference's share there
  (``runner.worker.REFERENCE_SHARE_MB``) and the probe is skipped. Where the
  target ran to the end under the cap and the reference after it overran
  (``runner.worker.REFERENCE_OVERRAN``), the target is known to fit: the
  sides run apart at once, the reference given a whole cap of its own, and
  the probe is left for a case that overruns, dies or hangs even so;
- **a reference that raises in a used worker**: a case whose CPU reference raised
  (``evidence["reference_raised"]``) in a long-lived worker that had run other
  cases runs again in a fresh worker, and that worker is retired: a library
  the earlier cases left in a bad state (oneDNN's "could not create a
  primitive" after cases near the memory cap, 64 skips in a row) is the
  worker's, not the case's. Only the fresh worker's outcome is recorded;
- **lost workers are not verdicts**: a worker whose node died, was preempted
  or became unreachable (the transport says so, ``Death.lost``) takes
  nothing with it: its case runs again on another worker, up to
  ``MAX_LOST`` times, then is ``inconclusive``. A worker killed from outside
  without a fault signal (an OOM killer; ``Death.suspect``) gets its case one
  more try, on another node where there is one; dying twice is a ``crash``.
  A fault signal (SIGSEGV, SIGABRT in the worker's fault log) is a crash at
  once. Every such retry is in the outcome's ``evidence["infra_retries"]``
  (node, reason), once per case;
- **warm-up**: a worker reports ready only after loading what its kinds of
  case need, so a case's timeout measures the case.

``fresh=True`` gives every case a process of its own (flaky reruns,
reproducer checks, a user script's sides), with the same rules.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Mapping

from conformance.case import Case
from conformance.journal import CPU, CaseJournal
from conformance.outcome import REFERENCE_RAISED, Outcome, Status
from conformance.settings import RunSettings
from results.store import RETRIES_KEY  # evidence: [{"node", "reason", "during", "kind"}], the harness's retries

from .transports import Death, Transport, TransportError, make_transport
from .worker import CRASH_DIR_ENV, RECYCLE_FRACTION, REFERENCE_OVERRAN, REFERENCE_SHARE_MB

POLL_S = 0.25
WORKER_START_TIMEOUT_S = 300.0
MAX_LOST = 3  # times one case may lose its worker to the cluster before it is reported inconclusive
DEDICATED = ("apart", "fresh")  # follow-ups that take a worker of their own (see _start_dedicated)
MAX_START_LOSSES = 20  # workers lost to the cluster while starting, per supervisor, before the run gives up
# faulthandler's first line, per fatal signal (Python/faulthandler.c).
FAULT_SIGNALS = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE",
                 "Illegal instruction": "SIGILL"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A case to run, with what only some callers need.

    ``env``: the environment its process must start with (a user script's CPU
    side runs with the backend's autoload off); only fresh processes can
    honour it. ``repro_of``: do not run the case, only write the reproducer
    of this outcome. ``attempt``: the caller's count (the gate's reruns).
    """

    case: Case
    env: Mapping[str, str] = field(default_factory=dict)
    repro_of: Outcome | None = None
    attempt: int = 0


@dataclass(slots=True)
class _Slot:
    handle: object
    spawned: float
    ready: bool = False
    info: dict = field(default_factory=dict)
    job: Job | None = None
    verb: str | None = None  # run | apart | probe | repro
    outcome: Outcome | None = None  # probe / repro: the outcome being completed
    started: float = 0.0
    served: int = 0
    dedicated: bool = False  # started for one request (sides apart, or a fresh worker); retired after it


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as a progress display (or a test) sees it: ready or starting, where it runs, its case."""

    ready: bool
    info: dict  # what the worker reported when ready: pid, host, node (a Ray node id)
    case: Case | None  # the case it is running, probing or writing a reproducer for


def reference_at_fault(outcome: Outcome, how: str) -> Outcome:
    """The reference alone also crashed, hung or overran: the case cannot be judged (a skip, with the evidence)."""
    return Outcome(
        case_id=outcome.case_id,
        status=Status.SKIP,
        message=f"the CPU reference alone also {how} on this case, so the target cannot be judged "
                f"(target outcome: {outcome.status.value}: {outcome.message})",
        evidence={**outcome.evidence, "target_status": outcome.status.value, "reference_at_fault": True},
        duration_s=outcome.duration_s,
    )


class Supervisor:
    """Runs cases on ``jobs`` workers of a transport and yields Outcomes as they finish."""

    def __init__(self, settings: RunSettings, *, jobs: int = 1, transport: str | Transport = "local",
                 address: str | None = None, fresh: bool = False, persistent: bool = False,
                 on_progress: Callable[[Case, dict], None] | None = None) -> None:
        """``persistent``: keep the workers between ``run`` calls (until ``close``), as the pytest route does."""
        if jobs < 1:
            raise ValueError(f"jobs={jobs!r} (type=int): must be >= 1")
        self.settings = settings
        self.jobs = jobs
        self.transport = make_transport(transport, address) if isinstance(transport, str) else transport
        self.fresh = fresh
        self.persistent = persistent
        self.on_progress = on_progress
        self._slots: list[_Slot] = []
        self._crash_dir = tempfile.mkdtemp(prefix="neuron-validate-faults-")
        self._warmup = settings.warmup  # the kinds workers warm up for; by default, those of the cases given
        self._retries: dict[int, tuple[Job, list[dict]]] = {}  # by id(job): the harness's retries so far
        self._start_losses = 0
        # Worker starts by why they were needed, and the seconds from start to ready summed over them: what a
        # run paid beyond its cases' own time (SuiteSummary.starts_line says it).
        self.starts: dict[str, int] = {}
        self.warmup_seconds = 0.0

    # ---------------------------------------------------------------- workers
    def _settings_for(self, job: Job | None, rss_limit_mb: int | None = None) -> RunSettings:
        """A worker's settings: the run's, plus (for a fresh worker) its job's environment and kind."""
        env = {**self.settings.env, **(job.env if job else {}), CRASH_DIR_ENV: self._crash_dir}
        warmup = self._warmup or ((job.case.kind,) if job else ())
        if rss_limit_mb is None:
            return replace(self.settings, env=env, warmup=warmup)
        return replace(self.settings, env=env, warmup=warmup, rss_limit_mb=rss_limit_mb,
                       run_cap_mb=self.settings.rss_limit_mb)

    def _spawn(self, job: Job | None = None, rss_limit_mb: int | None = None, *, why: str = "",
               since: float | None = None) -> _Slot:
        """A worker started for ``job`` (or the pool); ``since``: when its start began (its zygote prepared)."""
        why = why or ("fresh" if self.fresh else "sides apart" if rss_limit_mb is not None else "pool")
        self.starts[why] = self.starts.get(why, 0) + 1
        started = since or time.monotonic()  # a zygote's preload, where this start made one, counts (runner/zygote.py)
        slot = _Slot(handle=self.transport.start(self._settings_for(job, rss_limit_mb)), spawned=started)
        self._slots.append(slot)
        return slot

    def _retire(self, slot: _Slot) -> None:
        slot.handle.kill()
        self._slots.remove(slot)
        self._remove_crash_log(slot)

    def _remove_crash_log(self, slot: _Slot) -> None:
        path = slot.info.get("crash_log")
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass

    def close(self) -> None:
        for slot in list(self._slots):
            if slot.job is None:
                slot.handle.stop()
            self._retire(slot)
        self.transport.close()
        # Journals of cases that never completed (a timeout, a death past its resumes) have no one left to read
        # them: the run's folder goes whole, or a nightly would leave one behind per run.
        shutil.rmtree(self._crash_dir, ignore_errors=True)

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def workers(self) -> list[WorkerView]:
        """The workers now, with the case each is busy with."""
        return [WorkerView(ready=s.ready, info=dict(s.info), case=s.job.case if s.job else None)
                for s in list(self._slots)]

    # ---------------------------------------------------------------- running
    def run(self, cases: Iterable[Case | Job]) -> Iterator[Outcome]:
        for _, outcome in self.run_jobs(cases):
            yield outcome

    def run_one(self, case: Case | Job) -> Outcome:
        """Runs a single case (with the same isolation) and returns its outcome."""
        return list(self.run([case]))[-1]

    def run_jobs(self, items: Iterable[Case | Job]) -> Iterator[tuple[Job, Outcome]]:
        """Yields (job, outcome) as jobs finish; given a deque, the caller may append jobs while iterating."""
        queue: deque = items if isinstance(items, deque) else deque(items)
        kinds = set()
        for item in queue:
            job = item if isinstance(item, Job) else Job(case=item)
            if job.env and not self.fresh:
                raise ValueError(f"{job.case.title}: a case with an environment of its own needs fresh processes")
            kinds.add(job.case.kind)
        if not self._warmup and not self._slots:
            # Workers load what these kinds need before they report ready, so no case's timeout (nor a
            # probe's, on a replacement worker) counts loading op_db or the model packages.
            self._warmup = tuple(sorted(kinds))
        followups: deque[tuple[Job, Outcome, str]] = deque()
        try:
            yield from self._loop(queue, followups)
        finally:
            if not self.persistent:
                self.close()

    def _next_job(self, queue: deque) -> Job:
        item = queue.popleft()
        return item if isinstance(item, Job) else Job(case=item)

    def _assign(self, slot: _Slot, job: Job, verb: str, outcome: Outcome | None = None) -> None:
        slot.job, slot.verb, slot.outcome, slot.started = job, verb, outcome, time.monotonic()
        case = job.case.to_dict()
        slot.handle.send(("run", case) if verb in ("run", "apart") else ("probe", case) if verb == "probe"
                         else ("repro", case, outcome.to_dict()))

    # ---------------------------------------------------------------- retries the harness owes a case
    def _note_retry(self, job: Job, node: str | None, reason: str, during: str, kind: str) -> list[dict]:
        """``kind``: lost (the cluster lost the worker), suspect (killed without a fault signal), memory (the
        sides ran apart)."""
        entries = self._retries.setdefault(id(job), (job, []))[1]
        entries.append({"node": node, "reason": reason, "during": during, "kind": kind})
        return entries

    def _tried_nodes(self, job: Job) -> set[str]:
        entry = self._retries.get(id(job))
        return {r["node"] for r in entry[1] if r["node"]} if entry else set()

    def _with_retries(self, job: Job, outcome: Outcome) -> tuple[Job, Outcome]:
        """The case's one outcome carries every retry the harness made for it."""
        entry = self._retries.pop(id(job), None)
        if entry:
            outcome.evidence[RETRIES_KEY] = entry[1]
        return job, outcome

    def _take_followup(self, followups: deque, slot: _Slot | None) -> tuple | None:
        """The first follow-up this worker should take. A case retried after its worker was lost prefers a
        node it has not run on: it waits while a worker on another node (busy now) may take it. Workers still
        starting are not waited for: on a cluster short of room they may never start."""
        node = slot.info.get("node") if slot is not None else None
        for item in followups:
            job, _, verb = item
            if verb in DEDICATED:
                continue
            avoid = self._tried_nodes(job)
            elsewhere = any(s.ready and s.info.get("node") not in avoid
                            for s in self._slots if s is not slot and not s.dedicated)
            if node is None or node not in avoid or not elsewhere:
                followups.remove(item)
                return item
        return None

    def _start_dedicated(self, followups: deque) -> None:
        """Follow-ups that need a worker of their own (the run's worker count is kept: an idle worker makes
        room): a case over the memory cap whose reference alone fits runs again with the reference's share on
        top of the cap ("apart"); a case whose reference raised in a used worker runs again in a fresh one."""
        for item in [f for f in followups if f[2] in DEDICATED]:
            if len(self._slots) >= self.jobs:
                idle = next((s for s in self._slots if s.ready and s.job is None and not s.dedicated), None)
                if idle is None:
                    return
                idle.handle.stop()
                self._retire(idle)
            followups.remove(item)
            job, outcome, verb = item
            if verb == "apart":
                slot = self._spawn(job, rss_limit_mb=outcome.evidence["sides_apart"]["rss_limit_mb"])
            else:
                slot = self._spawn(job, why="reference raised")
                verb, outcome = "run", None
            slot.dedicated = True
            slot.job, slot.verb, slot.outcome = job, verb, outcome  # sent once the worker is ready

    def _start_work(self, queue: deque, followups: deque) -> None:
        self._start_dedicated(followups)
        if self.fresh:
            picks = []
            while (queue or any(f[2] not in DEDICATED for f in followups)) \
                    and len(self._slots) + len(picks) < self.jobs:
                item = self._take_followup(followups, None)
                if item is not None:
                    picks.append(item)
                elif queue:
                    job = self._next_job(queue)
                    picks.append((job, job.repro_of, "repro") if job.repro_of is not None else (job, None, "run"))
                else:
                    break
            since = time.monotonic()
            if len(picks) > 1:  # jobs of several environments (a check's two sides): their zygotes preload together
                self.transport.prepare([self._settings_for(job) for job, _, _ in picks])
            for job, outcome, verb in picks:
                slot = self._spawn(job, since=since)
                slot.job, slot.verb, slot.outcome = job, verb, outcome  # sent once the worker is ready
            return
        idle = sum(1 for s in self._slots if s.job is None)
        for _ in range(min(self.jobs - len(self._slots), len(queue) + len(followups) - idle)):
            self._spawn()
        for slot in self._slots:
            if not slot.ready or slot.job is not None:
                continue
            item = self._take_followup(followups, slot) if followups else None
            if item is not None:
                job, outcome, verb = item
                self._assign(slot, job, verb, outcome)
            elif queue:
                job = self._next_job(queue)
                if job.repro_of is not None:
                    self._assign(slot, job, "repro", job.repro_of)
                else:
                    self._assign(slot, job, "run")

    def _loop(self, queue: deque, followups: deque) -> Iterator[tuple[Job, Outcome]]:
        while queue or followups or any(s.job is not None for s in self._slots):
            self._start_work(queue, followups)
            self.transport.wait([s.handle for s in self._slots], POLL_S)
            now = time.monotonic()
            for slot in list(self._slots):
                for reply in slot.handle.receive():
                    for job, outcome in self._on_reply(slot, reply, followups):
                        yield self._with_retries(job, outcome)
                    if slot not in self._slots:
                        break
                if slot in self._slots:
                    for job, outcome in self._on_clock(slot, now, followups):
                        yield self._with_retries(job, outcome)

    # ---------------------------------------------------------------- classification
    def _finish(self, slot: _Slot, *, keep: bool = True) -> None:
        """The slot's request is over; a fresh worker, or one that should not be kept, goes."""
        slot.job, slot.verb, slot.outcome = None, None, None
        slot.served += 1
        if self.fresh or slot.dedicated or not keep:
            self._retire(slot)

    def _replace(self, slot: _Slot, why: str) -> None:
        self._retire(slot)
        if not self.fresh:
            self._spawn(why=why)

    @staticmethod
    def _failed(job: Job, outcome: Outcome, followups: deque) -> None:
        """A crash, timeout or memory overrun: another worker probes the reference alone, then writes the reproducer."""
        followups.append((job, outcome, "probe"))

    def _on_reply(self, slot: _Slot, reply, followups: deque) -> Iterator[tuple[Job, Outcome]]:
        if isinstance(reply, Death):
            yield from self._on_death(slot, reply, followups)
            return
        verb = reply[0]
        if verb == "ready":
            slot.ready, slot.info = True, dict(reply[1] or {})
            self.warmup_seconds += time.monotonic() - slot.spawned
            if (self.fresh or slot.dedicated) and slot.job is not None:
                self._assign(slot, slot.job, slot.verb, slot.outcome)
        elif verb == "fatal":
            raise TransportError(f"worker failed to start: {reply[1]}")
        elif verb == "progress":
            if self.on_progress is not None and slot.job is not None:
                self.on_progress(slot.job.case, reply[2])
        elif verb == "done" and slot.verb == "apart":
            yield from self._apart_done(slot, Outcome.from_dict(reply[1]), followups)
        elif verb == "done":
            job, outcome = slot.job, Outcome.from_dict(reply[1])
            if outcome.status is Status.SKIP and outcome.evidence.get(REFERENCE_RAISED) and slot.served \
                    and not (self.fresh or slot.dedicated):
                self._note_retry(job, slot.info.get("node"), f"{outcome.message} (after {slot.served} other "
                                 "requests in that worker)", "run", "worker state")
                self._finish(slot, keep=False)  # what left the library in that state may still be there
                followups.appendleft((job, None, "fresh"))
                return
            if outcome.evidence.get("memory_cap"):
                self._finish(slot, keep=False)  # the allocator is left fragmented: a fresh worker is cheaper
                share = outcome.evidence.get(REFERENCE_SHARE_MB)
                if share is not None:  # the reference ran to the end beside the overrun: it fits alone
                    self._go_apart(job, outcome, share, "measured in the shared run", followups)
                    return  # the worker with the sides apart takes this one's place
                if outcome.evidence.get(REFERENCE_OVERRAN):  # the target fits: no probe before going apart
                    self._go_apart(job, outcome, None, "not measured: the target had run to the end within the cap",
                                   followups, reference_fits=False)
                    return
                self._failed(job, outcome, followups)
                if not self.fresh:
                    self._spawn(why="over the memory cap")
                return
            bloated = not self.fresh and self.settings.rss_limit_mb and \
                slot.handle.rss_mb() > self.settings.rss_limit_mb * RECYCLE_FRACTION
            self._finish(slot)
            if bloated and slot in self._slots:
                self._replace(slot, "memory kept")  # memory kept from earlier cases must not fail the next one
            yield job, outcome
        elif verb == "probed":
            job, outcome = slot.job, slot.outcome
            reference_mb = reply[2] if len(reply) > 2 else None
            if reply[1]:  # the reference alone overran the memory cap too
                self._finish(slot, keep=False)
                if not self.fresh:
                    self._spawn(why="over the memory cap")
                yield job, reference_at_fault(outcome, "exceeds the memory cap")
            elif (outcome.evidence.get("memory_cap") or outcome.evidence.get("died_under_cap")) \
                    and "sides_apart" not in outcome.evidence:
                self._finish(slot)
                self._go_apart(job, outcome, reference_mb, "probed alone", followups)
            elif self.settings.artifacts_dir and not outcome.repro:
                self._assign(slot, job, "repro", outcome)
            else:
                self._finish(slot)
                yield job, outcome
        elif verb == "repro":
            job, outcome = slot.job, slot.outcome
            outcome.repro = reply[1]
            if reply[2]:
                outcome.evidence["repro_error"] = reply[2]
            self._finish(slot)
            yield job, outcome

    def _go_apart(self, job: Job, outcome: Outcome, reference_mb: float | None, how: str, followups: deque, *,
                  reference_fits: bool = True) -> None:
        """Both sides shared one cap and the reference alone fits (or, ``reference_fits=False``, the target is known
        to fit and the reference was not probed): the case runs again in a worker given the reference's share on
        top of the cap (the whole cap again where the share is unknown), so the target keeps the cap to itself."""
        share = self.settings.rss_limit_mb if reference_mb is None else int(reference_mb * 1.25) + 64
        outcome.evidence["sides_apart"] = {"reference_mb": reference_mb, "reference_measured": how,
                                           "rss_limit_mb": self.settings.rss_limit_mb + share,
                                           "reference_known_to_fit": reference_fits}
        followups.appendleft((job, outcome, "apart"))

    @staticmethod
    def _unprobed_apart(outcome: Outcome) -> bool:
        """A case that went apart without knowing that its reference fits alone (see _go_apart): what goes wrong
        there is probed before anything is charged to the backend."""
        return (outcome.evidence.get("sides_apart") or {}).get("reference_known_to_fit") is False

    def _apart_done(self, slot: _Slot, outcome: Outcome, followups: deque) -> Iterator[tuple[Job, Outcome]]:
        """The case ran again with the reference's share on top of the cap (see _go_apart)."""
        job, first = slot.job, slot.outcome
        apart = first.evidence["sides_apart"]
        self._finish(slot)
        if outcome.evidence.get("memory_cap"):  # the target alone needs more than the cap: the backend's
            apart["message"] = outcome.message
            if self._unprobed_apart(first):  # unless the reference alone overruns it (the probe decides)
                apart["reference_known_to_fit"] = None  # probed from here: the probe's answer is final
                self._failed(job, first, followups)
                return
            if self.settings.artifacts_dir and not first.repro:
                followups.append((job, first, "repro"))
                return
            yield job, first
            return
        died = f"the worker died ({first.message}) under " if first.evidence.get("died_under_cap") else ""
        self._note_retry(job, None, f"{died}the memory cap of {self.settings.rss_limit_mb} MiB was shared by "
                                    "the reference and the target; ran again with the reference's share on top",
                         "run", "memory")
        outcome.evidence["sides_apart"] = {**apart, "first": first.message}
        yield job, outcome

    def _crash_details(self, slot: _Slot, death: Death) -> tuple[str, dict]:
        """The signal's name and evidence, from the exit status or the worker's fault-handler log."""
        reason, evidence = death.reason, dict(death.detail)
        path = slot.info.get("crash_log")
        text = ""
        if path:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except OSError:
                text = ""
        if text.strip():
            evidence["fault_traceback"] = text.split("\nExtension modules:")[0][:4000]  # the stack, not the list
            for words, name in FAULT_SIGNALS.items():
                if f"Fatal Python error: {words}" in text:
                    if not reason.startswith("SIG"):
                        reason = name
                    break
        evidence["signal"] = reason
        return reason, evidence

    def _on_death(self, slot: _Slot, death: Death, followups: deque) -> Iterator[tuple[Job, Outcome]]:
        reason, evidence = self._crash_details(slot, death)
        signalled = reason.startswith("SIG")  # the exit status or the fault log names a fatal signal
        if not slot.ready:
            if death.lost and not signalled and self._start_losses < MAX_START_LOSSES:
                self._start_losses += 1  # a worker lost with its node while starting: start another
                job, verb, pending = slot.job, slot.verb, slot.outcome
                self._retire(slot)
                if job is not None:  # a fresh or dedicated worker's request waits for the next one
                    followups.appendleft((job, pending, verb))
                return
            raise TransportError(f"worker died while starting: {reason}")
        job, verb, pending = slot.job, slot.verb, slot.outcome
        node = slot.info.get("node")
        elapsed = time.monotonic() - slot.started
        self._replace(slot, "died")
        if job is None:
            return
        if death.lost and not signalled:
            retries = self._note_retry(job, node, death.lost, verb, "lost")
            lost = sum(1 for r in retries if r["kind"] == "lost")
            if lost <= MAX_LOST:
                followups.appendleft((job, pending, verb))
                return
            if verb in ("run", "apart"):
                yield job, Outcome(case_id=job.case.id, status=Status.INCONCLUSIVE,
                                   message=f"not judged: the cluster lost this case's worker {lost} times "
                                           f"({', '.join(sorted({r['reason'] for r in retries}))})",
                                   evidence={**evidence, "infrastructure": True}, duration_s=elapsed)
            else:  # a probe or reproducer the cluster kept losing: the case's outcome stands without it
                pending.evidence[f"{verb}_error"] = f"the cluster lost the worker {lost} times"
                yield job, pending
            return
        if death.suspect and not signalled and verb in ("run", "apart"):
            entry = self._retries.get(id(job))
            if not entry or not any(r["kind"] == "suspect" for r in entry[1]):
                self._note_retry(job, node, f"worker killed without a fault signal: {reason}", verb, "suspect")
                followups.appendleft((job, pending, verb))  # once more, on another node where there is one
                return
        if verb == "apart":  # died with the target's cap to itself: the backend's crash
            crashed = Outcome(case_id=job.case.id, status=Status.CRASH, message=f"worker process died: {reason}",
                              evidence={**evidence, "sides_apart": pending.evidence.get("sides_apart")},
                              duration_s=elapsed)
            if self._unprobed_apart(pending):  # once the reference alone is known to fit (the probe)
                crashed.evidence["sides_apart"]["reference_known_to_fit"] = None
                self._failed(job, crashed, followups)
                return
            if self.settings.artifacts_dir and not pending.repro:  # the dead worker could not write it
                followups.append((job, crashed, "repro"))
                return
            yield job, crashed
            return
        journal = CaseJournal(self._crash_dir, job.case.id) if verb == "run" else None
        if journal is not None and journal.crashed_now(reason):
            followups.appendleft((job, pending, "run"))  # the executor resumes past the step that died
            return
        if verb == "run":
            crashed = Outcome(case_id=job.case.id, status=Status.CRASH, message=f"worker process died: {reason}",
                              evidence=evidence, duration_s=elapsed)
            step = journal.in_flight()
            if step is not None and step["kind"] == CPU:  # it died in the CPU's own step: no probe needed
                skipped = reference_at_fault(crashed, f"dies ({reason})")
                skipped.evidence["reference_crash"] = step["samples"]
                yield job, skipped
                return
            if signalled and self.settings.rss_limit_mb:
                # A library that does not check an allocation dies of it (oneDNN under the cap: SIGSEGV): with
                # both sides in one capped worker that may be the harness's arrangement, so the sides run apart
                # once before the crash is charged to the backend (see "probed").
                crashed.evidence["died_under_cap"] = self.settings.rss_limit_mb
            self._failed(job, crashed, followups)
        elif verb == "probe":
            yield job, reference_at_fault(pending, f"dies ({reason})")
        else:
            pending.evidence["repro_error"] = f"reproducer writer died: {reason}"
            yield job, pending

    def _on_clock(self, slot: _Slot, now: float, followups: deque) -> Iterator[tuple[Job, Outcome]]:
        if not slot.ready:
            if now - slot.spawned > WORKER_START_TIMEOUT_S:
                if slot.job is None and any(s.ready for s in self._slots):
                    # A cluster that lost nodes may have no room for it: the run goes on with the workers it has
                    # (another is asked for, in case room comes back).
                    self._retire(slot)
                    return
                raise TransportError(f"worker did not start within {WORKER_START_TIMEOUT_S:.0f} s")
            return
        if slot.job is None or now - slot.started <= self.settings.timeout_s:
            return
        job, verb, pending = slot.job, slot.verb, slot.outcome
        elapsed = now - slot.started
        self._replace(slot, "timed out")
        if verb == "apart" and not self._unprobed_apart(pending):  # its own verdict, the cap to itself (probed)
            yield job, Outcome(case_id=job.case.id, status=Status.TIMEOUT,
                               message=f"timed out after {self.settings.timeout_s:g} s; the worker was stopped",
                               evidence={"timeout_s": self.settings.timeout_s}, duration_s=elapsed)
        elif verb in ("run", "apart"):  # apart: not probed yet
            timed_out = Outcome(case_id=job.case.id, status=Status.TIMEOUT,
                                message=f"timed out after {self.settings.timeout_s:g} s; the worker was stopped",
                                evidence={"timeout_s": self.settings.timeout_s}, duration_s=elapsed)
            if verb == "apart":
                timed_out.evidence["sides_apart"] = {**pending.evidence["sides_apart"], "reference_known_to_fit": None}
            self._failed(job, timed_out, followups)
        elif verb == "probe":
            yield job, reference_at_fault(pending, "hangs")
        else:
            pending.evidence["repro_error"] = "writing the reproducer timed out"
            yield job, pending


__all__ = ["Job", "MAX_LOST", "RETRIES_KEY", "Supervisor", "TransportError", "WorkerView", "reference_at_fault"]
