"""The Ray executor: the same cases, the same isolation, on a Ray cluster.

``--executor ray [--address ADDR]`` hands cases to ``jobs`` Ray actors, each
a long-lived worker process like the local pool's, and yields their outcomes
to the same suite loop, which writes them to the same store. Each actor asks
for one CPU, and for one NeuronCore where the cluster has them (Ray's
resource name is ``neuron_cores``; Ray then sets NEURON_RT_VISIBLE_CORES for
the actor's process, so actors never share a core).

Isolation holds as on the local pool: an actor whose process dies (a
segfault in a kernel) makes its case a ``crash`` outcome; a case that runs
past the timeout is a ``timeout``; an actor that grows past the RSS cap is
stopped and its case is a ``crash``. Each time the actor is replaced and the
run goes on, and the replacement writes the dead case's reproducer.

The workers get the run's environment (emulator profile and faults, backend
modules) through Ray's ``runtime_env``, so it is set before torch is imported
in the actor process. On a remote cluster neuron-validate must be installed
on every node.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Iterator

from .case import Case
from .outcome import Outcome, Status
from .pool import POLL_S, WORKER_START_TIMEOUT_S, ExecutorError
from .settings import RunSettings

NEURON_RESOURCE = "neuron_cores"  # Ray's name for AWS NeuronCores
RSS_POLL_S = 1.0


class _CaseActor:
    """One worker process on the cluster (wrapped with ``ray.remote`` at run time).

    The actor has two concurrency groups: the default one (one thread) runs
    cases, and "monitor" answers ``rss_mb`` while a case runs. The worker
    context is made in ``ready``, on the thread that runs cases, because it
    holds SQLite connections (the reference cache) that must stay on the
    thread that opened them.
    """

    def __init__(self, settings: RunSettings) -> None:
        os.environ.update(settings.worker_env())
        self.settings = settings
        self.ctx = None

    def ready(self) -> dict:
        from .worker import make_context

        self.ctx = make_context(self.settings)
        return {"pid": os.getpid(), "host": os.uname().nodename}

    def run(self, case: dict) -> dict:
        from .worker import execute

        return execute(Case.from_dict(case), self.ctx).to_dict()

    def repro(self, case: dict, outcome: dict) -> tuple[str | None, str | None]:
        from .worker import write_repro

        try:
            return write_repro(Case.from_dict(case), Outcome.from_dict(outcome), self.ctx), None
        except Exception as exc:  # noqa: BLE001
            return None, f"{type(exc).__name__}: {exc}"

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process().memory_info().rss / 2**20


@dataclass(slots=True)
class _Slot:
    actor: object
    ready_ref: object | None  # pending until the actor has started
    case: Case | None = None
    ref: object | None = None  # the running call
    repro: tuple[Case, Outcome] | None = None  # a reproducer being written instead of a case
    started: float = 0.0
    spawned: float = 0.0
    rss_ref: object | None = None
    rss_asked: float = 0.0


def _death_reason(exc: BaseException) -> str:
    text = str(exc)
    kind = re.search(r"Worker exit type: (\w+)", text)
    detail = "the actor's process died" if "worker process has died" in text or kind else text.splitlines()[0]
    return f"{detail}{f' ({kind.group(1)})' if kind else ''}"


class RayExecutor:
    """Runs cases on ``jobs`` Ray actors and yields Outcomes as they finish."""

    def __init__(self, settings: RunSettings, jobs: int = 1, address: str | None = None, *,
                 persistent: bool = False) -> None:
        """``persistent``: keep the actors between ``run`` calls (until ``close``), as LocalPool can."""
        if jobs < 1:
            raise ValueError(f"jobs={jobs!r} (type=int): must be >= 1")
        self.settings = settings
        self.jobs = jobs
        self.address = address
        self.persistent = persistent
        self._owns_ray = False
        self._slots: list[_Slot] = []
        self._actor_cls = None
        self.resources: dict[str, float] = {}

    # ---------------------------------------------------------------- cluster
    def _connect(self):
        try:
            import ray
        except ImportError:
            raise ExecutorError("--executor ray needs Ray: pip install 'neuron-validate[ray]'") from None
        if self._actor_cls is not None:  # persistent: connected by an earlier run
            return ray
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False,
                         configure_logging=False)
            except Exception as exc:  # noqa: BLE001 - any failure to reach the cluster is the user's to fix
                where = f"at {self.address}" if self.address else "locally"
                raise ExecutorError(f"cannot start or reach a Ray cluster {where}: {type(exc).__name__}: {exc}") from None
            self._owns_ray = True
        cluster = ray.cluster_resources()
        self.resources = {"num_cpus": 1}
        if cluster.get(NEURON_RESOURCE, 0) >= 1:
            self.resources["resources"] = {NEURON_RESOURCE: 1}
        actor = type("CaseActor", (_CaseActor,), {"rss_mb": ray.method(concurrency_group="monitor")(_CaseActor.rss_mb)})
        self._actor_cls = ray.remote(
            max_restarts=0, max_task_retries=0, max_concurrency=1, concurrency_groups={"monitor": 1},
            runtime_env={"env_vars": dict(self.settings.worker_env())}, **self.resources,
        )(actor)
        return ray

    def _spawn(self) -> _Slot:
        actor = self._actor_cls.remote(self.settings)
        return _Slot(actor=actor, ready_ref=actor.ready.remote(), spawned=time.monotonic())

    def _kill(self, slot: _Slot) -> None:
        import ray

        try:
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass

    def close(self) -> None:
        for slot in self._slots:
            self._kill(slot)
        self._slots = []
        self._actor_cls = None
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- run
    def run(self, cases: Iterable[Case]) -> Iterator[Outcome]:
        queue: deque[Case] = deque(cases)
        if not queue:
            return
        ray = self._connect()
        while len(self._slots) < min(self.jobs, len(queue)):
            self._slots.append(self._spawn())
        try:
            yield from self._loop(ray, queue)
        finally:
            if not self.persistent:
                for slot in self._slots:
                    self._kill(slot)
                self._slots = []

    def _replace(self, slot: _Slot) -> _Slot:
        self._kill(slot)
        fresh = self._spawn()
        self._slots[self._slots.index(slot)] = fresh
        return fresh

    def _loop(self, ray, queue: deque[Case]) -> Iterator[Outcome]:
        repro_queue: deque[tuple[Case, Outcome]] = deque()
        while queue or repro_queue or any(s.ref is not None for s in self._slots):
            for s in self._slots:
                if s.ready_ref is not None or s.ref is not None:
                    continue
                if repro_queue:
                    s.repro = repro_queue.popleft()
                    s.ref = s.actor.repro.remote(s.repro[0].to_dict(), s.repro[1].to_dict())
                elif queue:
                    s.case = queue.popleft()
                    s.ref = s.actor.run.remote(s.case.to_dict())
                else:
                    continue
                s.started = time.monotonic()
            pending = [r for s in self._slots for r in (s.ready_ref, s.ref, s.rss_ref) if r is not None]
            if pending:
                ray.wait(pending, num_returns=1, timeout=POLL_S)
                done = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0])
            else:
                time.sleep(POLL_S)
                done = set()
            now = time.monotonic()
            for s in list(self._slots):
                yield from self._check(ray, s, done, now, repro_queue)

    def _check(self, ray, s: _Slot, done: set, now: float, repro_queue) -> Iterator[Outcome]:
        from ray.exceptions import RayActorError

        if s.ready_ref is not None:
            if s.ready_ref in done:
                try:
                    ray.get(s.ready_ref)
                except Exception as exc:  # noqa: BLE001 - the actor's __init__ failed, or it died starting
                    raise ExecutorError(f"Ray worker failed to start: {str(exc).strip().splitlines()[-1][:300]}") from None
                s.ready_ref = None
            elif now - s.spawned > WORKER_START_TIMEOUT_S:
                raise ExecutorError(
                    f"Ray worker did not start within {WORKER_START_TIMEOUT_S:.0f} s (does the cluster have a free "
                    f"{'NeuronCore' if 'resources' in self.resources else 'CPU'}?)")
            return
        if s.ref is None:
            return
        if s.ref in done:
            try:
                value = ray.get(s.ref)
            except RayActorError as exc:
                yield from self._on_death(s, exc, now, repro_queue)
                return
            if s.repro is not None:
                case, outcome = s.repro
                path, error = value
                outcome.repro = path
                if error:
                    outcome.evidence["repro_error"] = error
                s.repro, s.ref = None, None
                yield outcome
                return
            s.case, s.ref, s.rss_ref = None, None, None
            yield Outcome.from_dict(value)
            return
        elapsed = now - s.started
        if elapsed > self.settings.timeout_s:
            if s.repro is not None:
                case, outcome = s.repro
                outcome.evidence["repro_error"] = "writing the reproducer timed out"
                self._replace(s)
                yield outcome
                return
            outcome = Outcome(case_id=s.case.id, status=Status.TIMEOUT,
                              message=f"timed out after {self.settings.timeout_s:g} s; the worker was stopped",
                              evidence={"timeout_s": self.settings.timeout_s, "executor": "ray"}, duration_s=elapsed)
            repro_queue.append((s.case, outcome))
            self._replace(s)
            return
        if s.repro is None:
            yield from self._check_rss(ray, s, done, now, elapsed, repro_queue)

    def _check_rss(self, ray, s: _Slot, done: set, now: float, elapsed: float, repro_queue) -> Iterator[Outcome]:
        if s.rss_ref is not None and s.rss_ref in done:
            try:
                rss = ray.get(s.rss_ref)
            except Exception:  # noqa: BLE001 - the actor is dying; its run call will say so
                rss = 0.0
            s.rss_ref = None
            if rss > self.settings.rss_limit_mb:
                outcome = Outcome(case_id=s.case.id, status=Status.CRASH,
                                  message=f"worker exceeded the RSS cap: {rss:.0f} MiB > {self.settings.rss_limit_mb} MiB",
                                  evidence={"rss_mb": rss, "rss_limit_mb": self.settings.rss_limit_mb,
                                            "executor": "ray"}, duration_s=elapsed)
                repro_queue.append((s.case, outcome))
                self._replace(s)
                return
        if s.rss_ref is None and now - s.rss_asked > RSS_POLL_S:
            s.rss_ref, s.rss_asked = s.actor.rss_mb.remote(), now
        yield from ()

    def _on_death(self, s: _Slot, exc: BaseException, now: float, repro_queue) -> Iterator[Outcome]:
        reason = _death_reason(exc)
        if s.repro is not None:  # died writing a reproducer: give up on that reproducer
            case, outcome = s.repro
            outcome.evidence["repro_error"] = f"reproducer writer died: {reason}"
            self._replace(s)
            yield outcome
            return
        outcome = Outcome(case_id=s.case.id, status=Status.CRASH, message=f"worker process died: {reason}",
                          evidence={"executor": "ray", "ray_error": str(exc)[:4000]}, duration_s=now - s.started)
        repro_queue.append((s.case, outcome))
        self._replace(s)
