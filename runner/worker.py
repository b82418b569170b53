"""The worker side of every transport: one process that runs cases, one at a time.

A worker starts with the run's environment (emulator profile, faults, backend
modules) set before torch is imported, loads what its kinds of case need
(warm-up), puts a hard cap on its own memory, says ``ready``, then answers
requests until told to stop. The supervisor (supervisor.py) owns every
policy; the worker only runs what it is asked and reports:

    ("run", case)               -> ("done", outcome)
    ("probe", case)             -> ("probed", None | "memory: ...", MiB)  the reference side alone, and
                                   the memory it took (MiB, None when unknown)
    ("repro", case, outcome)    -> ("repro", path | None, error | None)
    None                        -> the worker exits

while a case runs it may also send ("progress", case_id, event). The same
:class:`Worker` serves a pipe (a local process) and a Ray actor, so both
transports run and classify cases with the same code.

**Memory cap.** ``RLIMIT_DATA`` (the process's private writable memory) is
set to the cap plus what the worker had reserved but not touched when it
became ready, so the kernel refuses the allocation that would cross it: no
poll that a fast allocation can outrun. PyTorch turns the refusal into
"DefaultCPUAllocator: can't allocate memory", Python into MemoryError; a case
whose outcome carries either is reported as over the cap, however the
executor handled the error.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from conformance.case import Case
from conformance.outcome import GOLDEN_ERROR, Outcome, Status
from conformance.settings import RunSettings

from .executors import executor_for

# Above this fraction of the memory cap a worker hands freed memory back to the OS after its case, and the
# supervisor replaces a worker still above it (the allocator keeps freed memory, and a big model would
# otherwise push an innocent later case over the cap).
RECYCLE_FRACTION = 0.5
# What a refused allocation looks like once PyTorch or Python has turned it into an exception.
CRASH_DIR_ENV = "NEURON_VALIDATE_CRASH_DIR"  # set by the supervisor: where fault-handler logs go
ALLOCATION_FAILURES = ("can't allocate memory", "cannot allocate memory", "not enough memory", "memoryerror")


@dataclass(kw_only=True)
class WorkerContext:
    """What an executor gets besides its case.

    The reference and target are resolved on first use: a worker that runs
    only the CPU side of a user script must never register the target device.
    """

    settings: RunSettings
    artifacts: Path | None = None
    progress: Callable[[dict], None] = lambda event: None
    _resolved: dict = field(default_factory=dict, repr=False)

    @property
    def target(self):
        if "target" not in self._resolved:
            from conformance.target import resolve_target

            self._resolved["target"] = resolve_target(self.settings.target,
                                                      backend_modules=self.settings.backend_modules)
        return self._resolved["target"]

    @property
    def reference(self):
        if "reference" not in self._resolved:
            from conformance.target import resolve_target

            self._resolved["reference"] = resolve_target(self.settings.reference)
        return self._resolved["reference"]

    @property
    def cache(self):
        """The reference cache (runner.refcache.ReferenceCache), or None."""
        if "cache" not in self._resolved:
            cache = None
            if self.settings.reference_cache:
                import torch

                from .refcache import ReferenceCache, reference_key

                cache = ReferenceCache(self.settings.reference_cache,
                                       reference=reference_key(str(self.reference.spec), torch.get_num_threads()))
            self._resolved["cache"] = cache
        return self._resolved["cache"]


def make_context(settings: RunSettings) -> WorkerContext:
    return WorkerContext(settings=settings, artifacts=Path(settings.artifacts_dir) if settings.artifacts_dir else None)


# ---------------------------------------------------------------- memory
def _vm_kib(field_name: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def apply_memory_cap(limit_mb: int) -> int | None:
    """Caps this process's private writable memory; returns the limit in bytes (None: no cap, or not Linux)."""
    if limit_mb <= 0 or not sys.platform.startswith("linux"):
        return None
    import resource

    resident = _vm_kib("VmRSS") * 1024
    if limit_mb * 2**20 <= resident:
        raise ValueError(f"--rss-limit-mb {limit_mb}: below what a worker holds before its first case "
                         f"({resident / 2**20:.0f} MiB)")
    reserved_untouched = max(0, _vm_kib("VmData") * 1024 - resident)
    limit = limit_mb * 2**20 + reserved_untouched
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)  # a worker's own workers (a script's sides) inherit its cap as their ceiling
    # The soft limit is the one the kernel enforces; the hard one stays, so a nested worker can set its own.
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    return limit


@contextlib.contextmanager
def memory_allowance(extra_bytes: int):
    """The worker's memory cap raised by ``extra_bytes`` inside the block, then put back.

    A case that runs both sides in one worker gives one side the other side's resident share on top of the
    cap: the target then keeps the whole cap to itself, as in a worker of its own, without the case running
    twice (runner/supervisor.py's sides apart). Yields the bytes actually added (0: no cap, or none to add).
    """
    import resource

    if extra_bytes <= 0 or not sys.platform.startswith("linux"):
        yield 0
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft == resource.RLIM_INFINITY:
        yield 0
        return
    raised = soft + extra_bytes if hard == resource.RLIM_INFINITY else min(hard, soft + extra_bytes)
    resource.setrlimit(resource.RLIMIT_DATA, (raised, hard))
    try:
        yield raised - soft
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def allocation_failure(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in ALLOCATION_FAILURES)


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _refusal(error: str) -> str:
    """The allocator's own words from an error that carries them (after whatever the executor prefixed)."""
    for marker in ("DefaultCPUAllocator", "MemoryError"):
        at = error.find(marker)
        if at >= 0:
            return error[at:].strip().splitlines()[0][:200]
    return error.strip().splitlines()[0][:200] if error.strip() else "an allocation was refused"


# Evidence an executor leaves on a case whose target overran the memory cap while its CPU reference then ran to
# the end in the same worker: the reference's own share of memory (MiB). The reference is then known to fit
# alone, and the supervisor runs the sides apart at once, without a probe of the reference (supervisor.py).
REFERENCE_SHARE_MB = "reference_share_mb"
# Evidence an executor leaves where its target ran to the end under the cap and the CPU reference, after it, was
# refused an allocation (True). The target is known to fit the cap, so the sides run apart at once, the reference
# given a whole cap of its own; the probe is left for the rare case that overruns even so (supervisor.py).
REFERENCE_OVERRAN = "reference_overran_after_target"
MEMORY_EVIDENCE = (REFERENCE_SHARE_MB, REFERENCE_OVERRAN)  # what an executor's overrun outcome hands on


def memory_outcome(case_id: str, settings: RunSettings, error: str, duration_s: float = 0.0,
                   carried: dict | None = None) -> Outcome:
    """The one outcome of a case that needed more memory than the cap; ``carried``: the executor's evidence,
    of which the keys of :data:`MEMORY_EVIDENCE` are kept."""
    first = _refusal(error)
    evidence = {"memory_cap": True, "rss_limit_mb": settings.rss_limit_mb,
                "peak_rss_mb": round(_peak_rss_mb(), 1), "error": error[:2000]}
    for key in MEMORY_EVIDENCE:
        if (carried or {}).get(key) is not None:
            evidence[key] = round(carried[key], 1) if key == REFERENCE_SHARE_MB else carried[key]
    return Outcome(case_id=case_id, status=Status.CRASH,
                   message=f"exceeded the memory cap of {settings.rss_limit_mb} MiB: {first}",
                   evidence=evidence, duration_s=duration_s)


# ---------------------------------------------------------------- running cases
WARNINGS_KEPT = 5  # distinct warnings a case's evidence keeps (the most frequent)


@contextlib.contextmanager
def warnings_counted(counts: dict[str, int]):
    """The warnings a case raises, counted by category and first line instead of printed: OpInfo's samples
    alone warn hundreds of times a sweep ("options ignored"), which buried a run's progress. The filters are
    left as they are (what a library silences stays silent)."""
    def count(message, category, filename, lineno, file=None, line=None):
        text = str(message).strip()
        key = f"{category.__name__}: {text.splitlines()[0][:300] if text else ''}"
        counts[key] = counts.get(key, 0) + 1

    with warnings.catch_warnings():
        warnings.showwarning = count
        yield counts


def execute(case: Case, ctx: WorkerContext) -> Outcome:
    """Runs one case; a failure of the harness itself becomes an ``error`` with its traceback. The case's
    warnings go into its evidence (``warnings``), except where its executor shows them (a user script's)."""
    counts: dict[str, int] = {}
    outcome = _execute(case, ctx, counts)
    if counts:
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:WARNINGS_KEPT]
        outcome.evidence.setdefault("warnings", [f"{text} (x{n})" if n > 1 else text for text, n in top])
    return outcome


def _execute(case: Case, ctx: WorkerContext, counts: dict[str, int]) -> Outcome:
    start = time.perf_counter()
    try:
        executor = executor_for(case.kind)
        if executor.shows_warnings:
            outcome = executor.execute(case, ctx)
        else:
            with warnings_counted(counts):
                outcome = executor.execute(case, ctx)
    except Exception as exc:  # noqa: BLE001 - the worker must answer for every case (MemoryError included)
        text = f"{type(exc).__name__}: {exc}"
        if ctx.settings.rss_limit_mb and allocation_failure(text):
            refused = memory_outcome(case.id, ctx.settings, text, time.perf_counter() - start)
            refused.evidence["traceback"] = traceback.format_exc()[-4000:]  # where it overran (which side, which step)
            return refused
        outcome = Outcome(
            case_id=case.id,
            status=Status.ERROR,
            message=f"harness error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            evidence={"harness_error": True, "traceback": traceback.format_exc()},
        )
    # An executor that caught an allocation failure left it in its outcome: the case overran. A golden the judge
    # did without is not that (conformance.outcome.GOLDEN_ERROR): the verdict stands.
    scanned = {k: v for k, v in outcome.evidence.items() if k != GOLDEN_ERROR}
    if ctx.settings.rss_limit_mb and outcome.status is not Status.PASS and allocation_failure(
            outcome.message + json.dumps(scanned, default=str)):
        return memory_outcome(case.id, ctx.settings, outcome.message, time.perf_counter() - start,
                              outcome.evidence)
    if outcome.failed and ctx.artifacts is not None and not outcome.evidence.get("harness_error"):
        try:
            outcome.repro = write_repro(case, outcome, ctx)
        except Exception as exc:  # noqa: BLE001 - a reproducer that cannot be written is noted, not fatal
            outcome.evidence["repro_error"] = f"{type(exc).__name__}: {exc}"
    outcome.duration_s = time.perf_counter() - start
    return outcome


def probe(case: Case, ctx: WorkerContext) -> str | None:
    """Runs the reference side alone; returns "memory: ..." when that alone exceeds the cap, else None.

    A reference that raises is not at fault here: the normal run judges it.
    """
    runner = executor_for(case.kind).probe_reference
    if runner is None:
        return None
    try:
        runner(case, ctx)
    except Exception as exc:  # noqa: BLE001 - MemoryError included
        text = f"{type(exc).__name__}: {exc}"
        if ctx.settings.rss_limit_mb and allocation_failure(text):
            return f"memory: {text.splitlines()[0][:200]}"
    return None


@contextlib.contextmanager
def peak_growth():
    """Measures how far this process's resident size rose above where it stood on entry, at its peak (MiB).

    Yields a callable that returns the figure (at exit, or so far), or None where it cannot be measured. The
    peak is the kernel's high-water mark, reset on entry (Linux ``clear_refs``).
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident size
    except OSError:
        yield lambda: None
        return
    before = _vm_kib("VmRSS")
    yield lambda: max(0.0, (_vm_kib("VmHWM") - before) / 1024)


def reference_footprint(case: Case, ctx: WorkerContext) -> tuple[str | None, float | None]:
    """The probe, and how much the reference side alone took above what the worker held before (MiB).

    A case over the memory cap with both sides in one worker is given a worker
    with this much more, so that the target keeps the whole cap to itself
    (supervisor.py). An executor that runs the reference after the target can
    measure that share in the shared run itself (:data:`REFERENCE_SHARE_MB`),
    and the probe is skipped.
    """
    with peak_growth() as grown:
        result = probe(case, ctx)
    return result, grown()


def write_repro(case: Case, outcome: Outcome, ctx: WorkerContext) -> str | None:
    writer = executor_for(case.kind).write_repro
    if writer is None or ctx.artifacts is None:
        return None
    return writer(case, outcome, ctx)


def return_freed_memory(threshold_mb: float) -> None:
    """Hands the memory of a finished big case back to the OS, so the supervisor need not replace this worker.

    glibc keeps freed heap memory (its mmap threshold grows after large
    frees), so a worker that ran a big model stays large; ``malloc_trim``
    returns the free part. Only done above the threshold: it costs a few ms.
    Restarting a worker (importing torch, timm and transformers) costs seconds.
    """
    import gc

    if _vm_kib("VmRSS") / 1024 <= threshold_mb:
        return
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _glibc():
    """glibc, or None where the C library is another (the supervisor then replaces a large worker instead)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


# ---------------------------------------------------------------- the worker
class Worker:
    """Answers the supervisor's requests (see the module docstring); transport-agnostic."""

    def __init__(self, settings: RunSettings, send: Callable[[tuple], None]) -> None:
        self.settings = settings
        self.send = send
        self.ctx: WorkerContext | None = None
        self.case_id: str | None = None

    def start(self) -> dict:
        """Loads what the cases need and caps memory; raises when the worker cannot run cases at all."""
        os.environ.update(self.settings.worker_env())
        import emulator
        from conformance.seeding import skip_seeding_unavailable_backends

        emulator.apply_environment()  # the run's profile and faults, where the device registered before they were set

        self.ctx = make_context(self.settings)
        self.ctx.progress = self._progress
        import torch

        if self.settings.threads > 0:
            torch.set_num_threads(self.settings.threads)
        skip_seeding_unavailable_backends()
        executors = [executor_for(kind) for kind in self.settings.warmup]
        if not executors or any(e.resolves_targets for e in executors):
            self.ctx.target, self.ctx.reference  # noqa: B018 - resolved now: a missing device fails the start
        for executor in executors:
            if executor.warmup is not None:
                executor.warmup()
        limit = apply_memory_cap(self.settings.rss_limit_mb)
        return {"pid": os.getpid(), "host": os.uname().nodename, "threads": torch.get_num_threads(),
                "memory_limit_bytes": limit, "crash_log": _enable_fault_log()}

    def _progress(self, event: dict) -> None:
        if self.case_id is not None:
            self.send(("progress", self.case_id, event))

    def handle(self, request: tuple) -> None:
        verb = request[0]
        case = Case.from_dict(request[1])
        self.case_id = case.id
        try:
            if verb == "run":
                outcome = execute(case, self.ctx)
                return_freed_memory(self.settings.rss_limit_mb * RECYCLE_FRACTION)
                self.send(("done", outcome.to_dict()))
            elif verb == "probe":
                self.send(("probed", *reference_footprint(case, self.ctx)))
            elif verb == "repro":
                try:
                    path, error = write_repro(case, Outcome.from_dict(request[2]), self.ctx), None
                except Exception as exc:  # noqa: BLE001
                    path, error = None, f"{type(exc).__name__}: {exc}"
                self.send(("repro", path, error))
            else:
                raise ValueError(f"unknown request {verb!r}")
        finally:
            self.case_id = None


def _enable_fault_log() -> str | None:
    """Python's fault handler writes the stack of a fatal signal (SIGSEGV, SIGABRT, ...) to a file the
    supervisor reads when the worker dies: the evidence of a crash, and its signal where the transport
    (a Ray actor) cannot see the exit status."""
    import faulthandler

    folder = os.environ.get(CRASH_DIR_ENV)
    if not folder:
        return None
    path = os.path.join(folder, f"worker-{os.getpid()}.log")
    try:
        os.makedirs(folder, exist_ok=True)
        _enable_fault_log.file = open(path, "w")  # kept open for the life of the process
    except OSError:
        return None
    faulthandler.enable(file=_enable_fault_log.file, all_threads=False)
    return path


def die_with_parent() -> None:
    """Linux: the kernel kills this worker when the process that spawned it dies (even by SIGKILL).

    A worker is busy inside a case and would not notice its pipe closing, so
    without this a killed run leaves its workers computing, and holding memory,
    until their case ends.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def worker_main(conn, settings: RunSettings) -> None:
    """Entry point of a local worker process (spawned, or forked from a zygote: runner/zygote.py), serving a pipe."""
    die_with_parent()
    os.setpgrp()  # its own process group: the supervisor stops the worker and anything it started together
    worker = Worker(settings, conn.send)
    try:
        info = worker.start()
    except BaseException as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", info))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        worker.handle(request)


__all__ = ["Worker", "WorkerContext", "execute", "make_context", "worker_main", "RECYCLE_FRACTION"]
