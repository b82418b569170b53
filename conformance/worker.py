"""The worker side: runs cases one at a time in a process of its own.

A worker is started with the run's environment (emulator profile, faults,
backend modules) before torch is imported, resolves the reference and target
once, then answers requests from the pool: ``("run", case)`` returns an
Outcome, ``("repro", case, outcome)`` writes a reproducer for a case that
killed an earlier worker.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from .case import Case
from .outcome import Outcome, Status
from .settings import RunSettings

# How each case kind is executed: "module:function" taking (case, context).
KIND_EXECUTORS = {
    "op": "op_tests.execute:execute_op_case",
    "model": "conformance.model_case:execute_model_case",
    "script": "conformance.script_case:execute_script_case",
}
# Run only the reference side of a case that crashed or hung: if that dies too,
# the CPU reference is at fault and the case cannot be judged.
KIND_REFERENCE_PROBES = {
    "op": "op_tests.execute:probe_op_reference",
    "model": "conformance.model_case:probe_model_reference",
}
KIND_REPRO_WRITERS = {
    "op": "op_tests.execute:write_op_repro",
    "model": "conformance.model_case:write_model_repro",
}


# Above this fraction of the RSS cap a worker hands freed memory back to the OS after its case, and
# the pool replaces a worker still above it (conformance/pool.py).
RECYCLE_FRACTION = 0.5


@dataclass(kw_only=True)
class WorkerContext:
    """What an executor gets besides its case."""

    settings: RunSettings
    reference: object  # conformance.target.Target
    target: object
    cache: object | None  # conformance.refcache.ReferenceCache
    artifacts: Path | None


def _load(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_context(settings: RunSettings) -> WorkerContext:
    from .seeding import skip_seeding_unavailable_backends
    from .target import resolve_target

    skip_seeding_unavailable_backends()
    target = resolve_target(settings.target, backend_modules=settings.backend_modules)
    reference = resolve_target(settings.reference)
    cache = None
    if settings.reference_cache:
        from .refcache import ReferenceCache

        cache = ReferenceCache(settings.reference_cache, reference=str(reference.spec))
    artifacts = Path(settings.artifacts_dir) if settings.artifacts_dir else None
    return WorkerContext(settings=settings, reference=reference, target=target, cache=cache, artifacts=artifacts)


def execute(case: Case, ctx: WorkerContext) -> Outcome:
    """Runs one case; a failure of the harness itself becomes an ``error`` with its traceback."""
    start = time.perf_counter()
    try:
        executor = _load(KIND_EXECUTORS[case.kind])
        outcome = executor(case, ctx)
    except Exception as exc:  # noqa: BLE001 - the worker must answer for every case
        outcome = Outcome(
            case_id=case.id,
            status=Status.ERROR,
            message=f"harness error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            evidence={"harness_error": True, "traceback": traceback.format_exc()},
        )
    if outcome.failed and ctx.artifacts is not None and not outcome.evidence.get("harness_error"):
        try:
            outcome.repro = write_repro(case, outcome, ctx)
        except Exception as exc:  # noqa: BLE001 - a reproducer that cannot be written is noted, not fatal
            outcome.evidence["repro_error"] = f"{type(exc).__name__}: {exc}"
    outcome.duration_s = time.perf_counter() - start
    return outcome


def write_repro(case: Case, outcome: Outcome, ctx: WorkerContext) -> str | None:
    writer_path = KIND_REPRO_WRITERS.get(case.kind)
    if writer_path is None or ctx.artifacts is None:
        return None
    return _load(writer_path)(case, outcome, ctx)


def _return_freed_memory(threshold_mb: float) -> None:
    """Hands the memory of a finished big case back to the OS, so the pool need not replace this worker.

    glibc keeps freed heap memory (its mmap threshold grows after large
    frees), so a worker that ran a big model stays large; ``malloc_trim``
    returns the free part. Only done above the threshold: it costs a few ms.
    Restarting a worker (importing torch, timm and transformers) costs seconds.
    """
    import gc

    if _this_process().memory_info().rss / 2**20 <= threshold_mb:
        return
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _this_process():
    import psutil

    return psutil.Process()


@functools.cache
def _glibc():
    """glibc, or None where the C library is another (the pool then replaces a large worker instead)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the run that spawned it dies (even by SIGKILL).

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
    """Entry point of a worker process (spawned with a clean interpreter)."""
    _die_with_parent()
    os.environ.update(settings.worker_env())
    try:
        ctx = make_context(settings)
        for path in settings.warmup:
            _load(path)()
    except Exception as exc:  # noqa: BLE001
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        verb = request[0]
        if verb == "run":
            case = Case.from_dict(request[1])
            outcome = execute(case, ctx)
            _return_freed_memory(settings.rss_limit_mb * RECYCLE_FRACTION)
            conn.send(("done", outcome.to_dict()))
        elif verb == "repro":
            case, outcome = Case.from_dict(request[1]), Outcome.from_dict(request[2])
            probe = KIND_REFERENCE_PROBES.get(case.kind)
            if probe and outcome.status in (Status.CRASH, Status.TIMEOUT):
                try:
                    _load(probe)(case, ctx)
                except Exception:  # noqa: BLE001 - a reference that raises is judged by the normal run
                    pass
            conn.send(("probed", None, None))
            try:
                path = write_repro(case, outcome, ctx)
            except Exception as exc:  # noqa: BLE001
                path = None
                conn.send(("repro", None, f"{type(exc).__name__}: {exc}"))
                continue
            conn.send(("repro", path, None))
