"""A preloaded parent that forks local workers in milliseconds.

A worker started with a clean interpreter (``spawn``) imports torch, the
emulated device and what its kinds of case need (OpInfo's database for
operator cases, the model libraries for the zoo): 3.5 s of a core when the
machine is idle, 6 to 9 s when it is busy. A run pays that again for every
replacement worker, reference probe, sides-apart rerun and fresh process; the
test suite alone started some 400. A zygote is spawned once with the
workers' environment, imports all that, and ``torch._dynamo``, which PyTorch
would import in each worker at its first optimizer, custom op or seeding of
a registered backend, and forks each worker from there.
What a worker sets again as it starts (the emulated device's profile and
faults, a build's compile cache: :data:`RUNTIME_ENV`) is left out of that
environment, so runs that differ only there share one zygote.

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
backends' autoload off, so it has its own zygote). Each forked worker seeds
Python's and NumPy's global generators from the OS, as a new interpreter
does, so no two workers share a stream by accident; a script's side then
seeds them, and torch's, from its check's ``--seed``, alike on every side
(validate/training.py).

Zygotes belong to the process (:class:`ZygotePool`), not to one run: a
check's second supervisor (its perturbed runs), a test session's next run
with the same environment, fork from the zygote the first one started.

Requests on the zygote's pipe:  (settings, state at the fork), then the worker's pipe as a file descriptor
-> ("forked", pid);
None -> exit.  Unprompted: ("exited", pid, exitcode) for each child reaped,
exitcode as ``multiprocessing.Process.exitcode`` gives it (-N: signal N).
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import sys
import threading
import time
import traceback
from collections import OrderedDict
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait

from conformance.seeding import seed_host_generators
from conformance.settings import COMPILE_CACHE_ENV, RunSettings
from emulator import FAULTS_ENV, PROFILE_ENV

from .worker import CRASH_DIR_ENV

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


# Variables a worker takes when it starts, whatever was imported before: a zygote is shared across their values,
# and each forked worker gets them as a spawned one would (the supervisor's at the fork, then its run's own).
# The compile cache names a build's folder (a test session makes one per test), the crash folder a supervisor's,
# pytest's variable the test. The emulated device's profile and faults are read when it registers, at the import
# of torch, but every worker sets them again as it starts (emulator.apply_environment): the zygote registers the
# device with neither, and a run's faults strike only in its own workers, never in the zygote's imports.
RUNTIME_ENV = frozenset({"PYTEST_CURRENT_TEST", COMPILE_CACHE_ENV, CRASH_DIR_ENV, PROFILE_ENV, FAULTS_ENV})
KEEP_IDLE = 2  # idle zygotes a process keeps for its next runs (each holds torch and the libraries: ~0.7 GB)


def environment_key(settings: RunSettings) -> tuple:
    """Workers whose environment and warm-up match share one zygote (it imported torch with that environment)."""
    env = {k: v for k, v in {**os.environ, **settings.worker_env()}.items() if k not in RUNTIME_ENV}
    return tuple(sorted(env.items())), tuple(sorted(settings.warmup))


def _at_fork() -> dict:
    """What a spawned worker takes from the supervisor's process when it starts, and a forked one at its fork:
    the run-time variables, the working directory and ``sys.path`` (multiprocessing's ``spawn`` passes the
    last two). The zygote's may be a test or a run older."""
    return {"env": {k: os.environ[k] for k in RUNTIME_ENV if k in os.environ}, "cwd": os.getcwd(),
            "sys_path": list(sys.path)}


def _take(state: dict) -> None:
    os.environ.update(state["env"])
    try:
        os.chdir(state["cwd"])
    except OSError:
        pass  # gone since: the worker starts in the zygote's directory
    sys.path[:] = state["sys_path"]


# ---------------------------------------------------------------- the zygote process
def zygote_main(conn, settings: RunSettings) -> None:
    from .worker import die_with_parent

    die_with_parent()
    os.environ.update(settings.worker_env())
    for name in RUNTIME_ENV:  # each worker gets its own at its fork (_at_fork, _take)
        os.environ.pop(name, None)
    try:
        importlib.import_module("torch")  # with its device backends (the emulator's autoload)
        # PyTorch imports dynamo at a process's first optimizer, custom op or manual_seed with a backend
        # registered: 1.9 s of a core that every forked worker paid again in its first case.
        importlib.import_module("torch._dynamo")
        from .executors import executor_for

        for kind in settings.warmup:
            executor = executor_for(kind)
            if executor.warmup is not None:
                executor.warmup()
    except BaseException as exc:  # noqa: BLE001 - a spawned worker then reports it in its own words
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    running = 0  # workers forked and not reaped: while there are none, it waits on its pipe without polling
    while True:
        if wait([conn], timeout=REAP_INTERVAL_S if running else None):
            try:
                request = conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            if request is None:
                os._exit(0)  # nothing to finalise: it only imported
            worker_settings, state = request
            worker_pipe = Connection(reduction.recv_handle(conn))  # its end of the worker's pipe, sent beside
            pid = os.fork()
            if pid == 0:
                _take(state)
                _become_worker(conn, worker_pipe, worker_settings)
            worker_pipe.close()
            conn.send(("forked", pid))
            running += 1
        running -= _reap(conn)


def _become_worker(zygote_conn, worker_pipe, settings: RunSettings) -> None:
    """The forked child: serves its pipe as a spawned worker would, then exits without returning."""
    from .worker import worker_main

    code = 0
    try:
        zygote_conn.close()
        seed_host_generators(None)  # as a new interpreter seeds them: a fork copies the zygote's
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


def _reap(conn) -> int:
    """Sends the exit status of each child that ended; returns how many."""
    reaped = 0
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        conn.send(("exited", pid, os.waitstatus_to_exitcode(status)))
        reaped += 1


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
        self.ready = False
        # Its pipe is read by whichever run asks: runs in several threads of one process (zygotes are the
        # process's) must not take each other's replies.
        self._lock = threading.RLock()

    def wait_ready(self) -> None:
        """Waits for its preload; ZygoteError (and the zygote closed) where it failed."""
        with self._lock:
            if self.ready:
                return
            reply = self._next(READY_TIMEOUT_S)
            if not reply or reply[0] != "ready":
                self.close()
                raise ZygoteError(reply[1] if reply and reply[0] == "fatal" else "the zygote did not start")
            self.ready = True

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
        with self._lock:
            try:
                while self.conn.poll():
                    self._recorded(self.conn.recv())
            except (EOFError, OSError):
                pass

    def fork(self, worker_pipe, settings: RunSettings) -> int:
        with self._lock:
            # The worker's end of its pipe goes as a file descriptor over the zygote's own socket (SCM_RIGHTS).
            # Pickled with the request, multiprocessing shared it through a listening socket in the temporary
            # folder instead, whose path a long TMPDIR (over about 75 characters) makes too long for AF_UNIX:
            # every run failed with "OSError: AF_UNIX path too long".
            self.conn.send((settings, _at_fork()))
            reduction.send_handle(self.conn, worker_pipe.fileno(), self.process.pid)
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


class ZygotePool:
    """This process's zygotes by environment, shared by every local transport: a migration check's several
    supervisors (its sides, then its perturbed runs), a test session's runs, the pytest plugin's run.

    A zygote with live workers is never closed; of the idle ones, the ``keep_idle`` used last are kept and
    the others closed (a long-lived process whose environment changes case after case keeps a few, not one
    per change). All close when the process exits; they would die with it anyway (PR_SET_PDEATHSIG).
    """

    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self.keep_idle = keep_idle
        self.preloads = 0  # zygotes started: each is one import of torch and the warm-ups
        self._zygotes: OrderedDict[tuple, Zygote | None] = OrderedDict()  # None: it could not preload
        self._retired: list[Zygote] = []  # failed to fork while workers of theirs may still run
        self._lock = threading.Lock()

    def get(self, ctx, settings: RunSettings) -> Zygote | None:
        """The zygote for these settings, ready, started if there is none; None where it cannot preload (the
        transport then spawns, and the worker reports what stopped it in its own words)."""
        with self._lock:
            zygote = self._started(ctx, settings)
            if zygote is not None:
                try:
                    zygote.wait_ready()
                except ZygoteError:
                    self._zygotes[environment_key(settings)] = zygote = None
            self._trim()
            return zygote

    def prepare(self, ctx, settings: list[RunSettings]) -> None:
        """Starts the zygotes these settings need, all at once: their preloads overlap (a check's two sides
        have two environments), where one :meth:`get` after another would wait for each in turn."""
        with self._lock:
            for one in settings:
                self._started(ctx, one)

    def _started(self, ctx, settings: RunSettings) -> Zygote | None:
        key = environment_key(settings)
        zygote = self._zygotes.get(key)
        if key in self._zygotes and (zygote is None or zygote.alive):
            self._zygotes.move_to_end(key)
            return zygote
        zygote = Zygote(ctx, settings)
        self.preloads += 1
        self._zygotes[key] = zygote
        return zygote

    def retire(self, settings: RunSettings) -> None:
        """The zygote for these settings failed to fork: the next start makes another; its workers run on."""
        with self._lock:
            zygote = self._zygotes.pop(environment_key(settings), None)
            if zygote is not None:
                self._retired.append(zygote)

    def _trim(self) -> None:
        idle = [key for key, z in self._zygotes.items()  # used longest ago first
                if z is not None and z.ready and z.idle]
        for key in idle[:max(0, len(idle) - self.keep_idle)]:
            self._zygotes.pop(key).close()
        for zygote in [z for z in self._retired if z.idle]:
            zygote.close()
            self._retired.remove(zygote)

    def held(self) -> int:
        """Zygotes kept now (retired ones included)."""
        return sum(z is not None for z in self._zygotes.values()) + len(self._retired)

    def close(self) -> None:
        with self._lock:
            for zygote in [*self._zygotes.values(), *self._retired]:
                if zygote is not None:
                    zygote.close()
            self._zygotes.clear()
            self._retired.clear()


ZYGOTES = ZygotePool()
atexit.register(ZYGOTES.close)  # before multiprocessing's own exit handler, which would wait for them
