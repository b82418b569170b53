"""A preloaded parent that forks local workers in milliseconds.

A worker started with a clean interpreter (``spawn``) imports torch, the
emulated device and what its kinds of case need (OpInfo's database for
operator cases, the model libraries for the zoo): 3.5 s of a core when the
machine is idle, 6 to 9 s when it is busy. A run pays that again for every
replacement worker, reference probe, sides-apart rerun and fresh process; the
test suite alone started some 400. A zygote is spawned once with the
workers' environment, imports all that, and forks each worker from there.

Nothing runs in the zygote but imports: no case, no device initialisation
(CUDA must not be initialised before a fork), no intra-op thread pool. Each
worker then starts as a spawned one would (runner.worker.Worker.start: its
environment, its threads, the target resolved, its memory cap), and runs
the same code. Workers are the zygote's children, so the zygote reports how
each one ended; the exit status is what a crash is classified by.

Only where a fork is known to be safe: the emulated device or the CPU as
target, no backend module named (a real device's runtime may not survive a
fork), and operator, model and user-script-side cases. A script's side gets
what a spawned side had when its script started: torch and the harness
imported, with that side's environment (the CPU side's turns the device
backends' autoload off, so it has its own zygote). One thing differs:
workers forked from one zygote (the perturbed reference runs of one check)
start with the same state of Python's and NumPy's global random generators,
where spawned ones drew theirs from the OS. The harness seeds torch itself
and never relied on those differing; the target and the reference side come
from different zygotes, as before from different processes.

Requests on the zygote's pipe:  (worker_pipe, settings) -> ("forked", pid);
None -> exit.  Unprompted: ("exited", pid, exitcode) for each child reaped,
exitcode as ``multiprocessing.Process.exitcode`` gives it (-N: signal N).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import wait

from conformance.settings import RunSettings

FORKABLE_KINDS = frozenset({"op", "model", "script-side"})
READY_TIMEOUT_S = 300.0
REAP_INTERVAL_S = 0.02


def forkable(settings: RunSettings) -> bool:
    """Whether workers of these settings may be forked from a zygote (see the module docstring)."""
    if not sys.platform.startswith("linux") or settings.backend_modules:
        return False
    if not settings.warmup or not set(settings.warmup) <= FORKABLE_KINDS:
        return False
    device = settings.target.partition(":")[0]
    if device == "cpu":
        return True
    return device == "neuron" and importlib.util.find_spec("torch_neuronx") is None  # the emulated device


VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})  # changes while a persistent run's workers come and go


def environment_key(settings: RunSettings) -> tuple:
    """Workers whose environment and warm-up match share one zygote (it imported torch with that environment)."""
    env = {k: v for k, v in {**os.environ, **settings.worker_env()}.items() if k not in VOLATILE_ENV}
    return tuple(sorted(env.items())), tuple(sorted(settings.warmup))


# ---------------------------------------------------------------- the zygote process
def zygote_main(conn, settings: RunSettings) -> None:
    from .worker import die_with_parent

    die_with_parent()
    os.environ.update(settings.worker_env())
    try:
        importlib.import_module("torch")  # with its device backends (the emulator's autoload)
        from .executors import executor_for

        for kind in settings.warmup:
            executor = executor_for(kind)
            if executor.warmup is not None:
                executor.warmup()
    except BaseException as exc:  # noqa: BLE001 - a spawned worker then reports it in its own words
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        if wait([conn], timeout=REAP_INTERVAL_S):
            try:
                request = conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            if request is None:
                os._exit(0)  # nothing to finalise: it only imported
            worker_pipe, worker_settings = request
            pid = os.fork()
            if pid == 0:
                _become_worker(conn, worker_pipe, worker_settings)
            worker_pipe.close()
            conn.send(("forked", pid))
        _reap(conn)


def _become_worker(zygote_conn, worker_pipe, settings: RunSettings) -> None:
    """The forked child: serves its pipe as a spawned worker would, then exits without returning."""
    from .worker import worker_main

    code = 0
    try:
        zygote_conn.close()
        worker_main(worker_pipe, settings)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _reap(conn) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))


# ---------------------------------------------------------------- the supervisor's side
class ForkedProcess:
    """A worker forked by a zygote, with the part of ``multiprocessing.Process`` the transport uses."""

    sentinel = None  # the zygote's pipe says when it ends

    def __init__(self, zygote: "Zygote", pid: int) -> None:
        self.zygote, self.pid = zygote, pid

    @property
    def exitcode(self) -> int | None:
        return self.zygote.exitcode(self.pid)

    def is_alive(self) -> bool:
        return self.exitcode is None

    @property
    def orphaned(self) -> bool:
        """It died with its zygote (PR_SET_PDEATHSIG), whose death the supervisor must not charge to a case."""
        return self.pid not in self.zygote.exited and not self.zygote.alive

    def join(self, timeout: float | None = None) -> None:
        self.zygote.exitcode(self.pid, timeout=READY_TIMEOUT_S if timeout is None else timeout)

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ZygoteError(RuntimeError):
    """The zygote could not preload (the transport then spawns its workers)."""


class Zygote:
    """One zygote process and the exit statuses of the workers it forked."""

    def __init__(self, ctx, settings: RunSettings) -> None:
        self.conn, child = ctx.Pipe()
        # Not a daemon: its children (the workers) may start processes of their own; it exits when its pipe
        # closes or, through PR_SET_PDEATHSIG, when the supervisor's process dies.
        self.process = ctx.Process(target=zygote_main, args=(child, settings), daemon=False)
        self.process.start()
        child.close()
        self.exited: dict[int, int] = {}
        self.forked: set[int] = set()
        reply = self._next(READY_TIMEOUT_S)
        if not reply or reply[0] != "ready":
            self.close()
            raise ZygoteError(reply[1] if reply and reply[0] == "fatal" else "the zygote did not start")

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def _next(self, timeout: float):
        """The next message that is not an exit status (those are recorded), or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left < 0 or not (self.conn.poll(max(0.0, left)) if left > 0 else self.conn.poll()):
                return None
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return None
            if not self._recorded(message):
                return message

    def _recorded(self, message) -> bool:
        """Records an exit status; False for any other message."""
        if message[0] != "exited":
            return False
        self.exited[message[1]] = message[2]
        return True

    def pump(self) -> None:
        """Records the exit statuses the zygote has sent."""
        try:
            while self.conn.poll():
                self._recorded(self.conn.recv())
        except (EOFError, OSError):
            pass

    def fork(self, worker_pipe, settings: RunSettings) -> int:
        self.conn.send((worker_pipe, settings))
        reply = self._next(30.0)
        if not reply or reply[0] != "forked":
            raise ZygoteError("the zygote did not fork a worker")
        self.forked.add(reply[1])
        return reply[1]

    @property
    def idle(self) -> bool:
        """No worker of this zygote is alive (closing it then takes none with it)."""
        self.pump()
        return self.forked <= set(self.exited)

    def exitcode(self, pid: int, timeout: float = 0.0) -> int | None:
        """The worker's exit status once the zygote reaped it; None while it runs (or after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            if pid in self.exited:
                return self.exited[pid]
            if not self.alive:  # the zygote is gone: its children died with it (PR_SET_PDEATHSIG)
                self.pump()
                return self.exited.get(pid, -9)
            if time.monotonic() >= deadline:
                return None
            self.conn.poll(min(0.05, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()
