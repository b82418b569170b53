"""How the supervisor reaches its workers: local processes over pipes, or Ray actors.

A transport starts a worker with given settings, carries requests to it and
replies back, says when it died and why, and stops it. It decides nothing
about cases: every timeout, crash, memory and probe rule lives in the
supervisor, so a case gets the same outcome whichever transport ran it.

Both transports run the same :class:`runner.worker.Worker`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any, Protocol

from conformance.settings import RunSettings

from .zygote import ZYGOTES, ForkedProcess, Zygote, ZygotePool, ZygoteError, forkable


class TransportError(RuntimeError):
    """The transport itself cannot run (no Ray, no cluster, workers that cannot start)."""


@dataclass(frozen=True, slots=True)
class Death:
    """The worker's process is gone; ``reason`` reads like "SIGSEGV" or "exit code 3".

    ``lost``: set when the transport knows the worker went for a cause outside
    its case (its node died or was preempted, the actor became unreachable),
    e.g. "node lost". Such a death is never the case's verdict: the supervisor
    runs the case again elsewhere. ``suspect``: the transport cannot tell a
    worker killed from outside (by the node's OOM killer, by Ray's memory
    monitor) from one the case killed, so the supervisor gives the case a
    second try on another node before it calls it a crash.
    """

    reason: str
    detail: dict = field(default_factory=dict)
    lost: str | None = None
    suspect: bool = False


def signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def rss_mb(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        try:
            import psutil

            return psutil.Process(pid).memory_info().rss / 2**20
        except Exception:  # noqa: BLE001 - the process may be gone
            return 0.0


class Handle(Protocol):
    """One worker, as the supervisor sees it."""

    def send(self, request: Any) -> None: ...
    def receive(self) -> list:  # replies available now (tuples), then a Death once the worker is gone
        ...
    def rss_mb(self) -> float: ...
    def kill(self) -> None: ...


class Transport(Protocol):
    name: str

    def prepare(self, settings: list[RunSettings]) -> None: ...  # workers of these settings start next
    def start(self, settings: RunSettings) -> Handle: ...
    def wait(self, handles: list[Handle], timeout: float) -> None:  # until one may have something, or timeout
        ...
    def close(self) -> None: ...


# ---------------------------------------------------------------- local processes
class _ProcessHandle:
    def __init__(self, ctx, settings: RunSettings, zygote: Zygote | None = None) -> None:
        from .worker import worker_main

        self.conn, child = ctx.Pipe()
        self.zygote = zygote
        if zygote is not None:
            try:
                self.process = ForkedProcess(zygote, zygote.fork(child, settings))
            finally:
                child.close()
        else:
            # Not a daemon: a worker may itself start processes (a user script's, or a nested run's); it dies
            # with its parent through PR_SET_PDEATHSIG instead.
            self.process = ctx.Process(target=worker_main, args=(child, settings), daemon=False)
            self.process.start()
            child.close()
        self.gone = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, request) -> None:
        try:
            self.conn.send(request)
        except (OSError, BrokenPipeError):
            pass  # it died; receive() says how

    def receive(self) -> list:
        replies = []
        try:
            while self.conn.poll():
                replies.append(self.conn.recv())
        except (EOFError, OSError):
            pass
        if not replies and not self.gone and not self.process.is_alive():
            self.process.join(timeout=1)
            self.gone = True
            code = self.process.exitcode
            if getattr(self.process, "orphaned", False):  # its zygote died and took it along: not its case's doing
                replies.append(Death("zygote died", {"exitcode": None}, lost="the zygote it was forked from died"))
            else:
                replies.append(Death(signal_name(code), {"exitcode": code, "signal": signal_name(code)}))
        return replies

    def rss_mb(self) -> float:
        return rss_mb(self.process.pid)

    def kill(self) -> None:
        if self.process.is_alive():
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # the worker leads its own process group
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def stop(self) -> None:
        """Asks an idle worker to exit, then makes sure it has."""
        if self.process.is_alive():
            self.send(None)
            self.process.join(timeout=5)
        self.kill()


class ProcessTransport:
    """Workers are local processes talking over pipes: forked from a zygote that imported what they need
    (runner/zygote.py) where that is safe, else started with a clean interpreter (``spawn``)."""

    name = "local"

    def __init__(self, zygotes: ZygotePool = ZYGOTES) -> None:
        self._ctx = mp.get_context("spawn")
        self.zygotes = zygotes  # the process's, shared with its other transports

    def prepare(self, settings: list[RunSettings]) -> None:
        """Workers of these settings are about to start: their zygotes preload side by side."""
        self.zygotes.prepare(self._ctx, [s for s in settings if forkable(s)])

    def start(self, settings: RunSettings) -> _ProcessHandle:
        zygote = self.zygotes.get(self._ctx, settings) if forkable(settings) else None
        if zygote is not None:
            try:
                return _ProcessHandle(self._ctx, settings, zygote)
            except ZygoteError:  # it died or stopped answering: spawn this one; the next start makes another
                self.zygotes.retire(settings)
        return _ProcessHandle(self._ctx, settings)

    def wait(self, handles: list[_ProcessHandle], timeout: float) -> None:
        live = [h for h in handles if not h.gone]
        if not live:
            time.sleep(timeout)
            return
        zygotes = {id(h.zygote): h.zygote for h in live if h.zygote is not None}
        for zygote in zygotes.values():
            zygote.pump()  # exit statuses are kept, so that its pipe wakes this wait only for new ones
        wait([h.conn for h in live] + [h.process.sentinel for h in live if h.process.sentinel is not None]
             + [z.conn for z in zygotes.values()], timeout=timeout)

    def close(self) -> None:
        """Nothing of its own to close: the zygotes are the process's (:class:`ZygotePool`)."""


# ---------------------------------------------------------------- Ray actors
NEURON_RESOURCE = "neuron_cores"  # Ray's name for AWS NeuronCores


class _RayWorker:
    """The worker inside a Ray actor (wrapped with ``ray.remote`` at run time).

    Replies a request produces are returned together when it finishes. The
    actor has a second concurrency group, "monitor", that answers ``rss_mb``
    while a case runs.
    """

    def __init__(self, settings: RunSettings) -> None:
        os.environ.update(settings.worker_env())
        self.settings = settings
        self.worker = None
        self.outbox: list = []

    def ready(self) -> tuple:
        import ray

        from .worker import Worker

        _normal_priority()
        self.worker = Worker(self.settings, self.outbox.append)
        try:
            info = self.worker.start()
        except BaseException as exc:  # noqa: BLE001
            return ("fatal", f"{type(exc).__name__}: {exc}")
        # The node, by Ray's id: host names repeat (every node of a simulated cluster is this machine).
        return ("ready", {**info, "node": ray.get_runtime_context().get_node_id()})

    def handle(self, request) -> list:
        self.outbox.clear()
        self.worker.handle(request)
        return list(self.outbox)

    def rss_mb(self) -> float:
        return rss_mb(os.getpid())


def _normal_priority() -> None:
    """Ray starts worker processes at niceness 15, below anything else on the machine: on a loaded node a
    case then waits for the CPU, and its timeout measures the load, not the case. Cases run at normal
    priority, as in a local worker (where the process may not raise its priority, it stays as it is)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (OSError, AttributeError):
        pass


def _node_alive(node: str | None) -> bool:
    """Whether Ray still counts the node alive (True when it cannot be asked: then nothing is assumed)."""
    if not node:
        return True
    import ray

    try:
        return any(n.get("NodeID") == node and n.get("Alive") for n in ray.nodes())
    except Exception:  # noqa: BLE001 - the cluster itself may be unreachable for a moment
        return True


def _ray_death(exc: BaseException, node: str | None) -> Death:
    """Why an actor went, as far as Ray can tell.

    Ray cannot see the exit status of an actor's process: a signal comes from
    the worker's fault log (the supervisor reads it); Ray's own text lists
    possible causes, not the cause. What Ray does know is whether the node
    died or was preempted, or the actor became unreachable; a node removed
    abruptly may first show as a worker that died, so the node's liveness is
    asked too.
    """
    from ray.exceptions import ActorUnavailableError

    text = str(exc)
    detail = {"ray_error": text[:4000], "node": node}
    if isinstance(exc, ActorUnavailableError):
        return Death("actor unreachable", detail, lost="actor unreachable")
    if getattr(exc, "preempted", False):
        return Death("node preempted", detail, lost="node preempted")
    if "its node has died" in text or not _node_alive(node):
        return Death("node lost", detail, lost="node lost")
    kind = re.search(r"Worker exit type: (\w+)", text)
    return Death(f"actor died ({kind.group(1)})" if kind else "actor died", detail, suspect=True)


class _RayHandle:
    def __init__(self, actor_cls, settings: RunSettings) -> None:
        self.actor = actor_cls.remote(settings)
        self.ref = self.actor.ready.remote()
        self.expect_list = False
        self.gone = False
        self.pending_rss = None
        self.node: str | None = None  # from the ready reply

    def send(self, request) -> None:
        if request is None:
            return
        self.ref = self.actor.handle.remote(request)
        self.expect_list = True

    def refs(self) -> list:
        return [self.ref] if self.ref is not None else []

    def receive(self) -> list:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        if self.ref is None or self.gone:
            return []
        ready, _ = ray.wait([self.ref], timeout=0)
        if not ready:
            return []
        from ray.exceptions import NodeDiedError, ObjectLostError, OwnerDiedError, RaySystemError

        ref, self.ref = self.ref, None
        try:
            value = ray.get(ref)
        except (RayActorError, GetTimeoutError) as exc:
            self.gone = True
            return [_ray_death(exc, self.node)]
        except (NodeDiedError, ObjectLostError, OwnerDiedError, RaySystemError) as exc:
            self.gone = True  # the cluster lost the reply or its node: nothing the case did
            return [Death("cluster unreachable", {"ray_error": str(exc)[:4000], "node": self.node},
                          lost="cluster unreachable")]
        except Exception as exc:  # noqa: BLE001 - a task error means the worker code itself raised
            self.gone = True
            return [Death(f"actor task failed: {str(exc).strip().splitlines()[-1][:200]}", {"ray_error": str(exc)[:4000]})]
        if not self.expect_list and isinstance(value, tuple) and value[0] == "ready":
            self.node = (value[1] or {}).get("node")
        return list(value) if self.expect_list else [value]

    def rss_mb(self) -> float:
        import ray

        try:
            return float(ray.get(self.actor.rss_mb.remote(), timeout=30))
        except Exception:  # noqa: BLE001 - dying; its running call will say so
            return 0.0

    def kill(self) -> None:
        import ray

        self.gone = True
        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead
            pass

    def stop(self) -> None:
        self.kill()


LOOPBACK = "127.0.0.1"
# Ray rewrites a loopback address to the machine's routable one unless this is 0 (read when ray is imported).
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _is_loopback(address: str | None) -> bool:
    if address in (None, "local"):
        return True
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def loopback_env(address: str | None = None) -> None:
    """Sets what Ray reads at import (and its raylets and workers inherit) for a local or loopback cluster;
    where this process imported Ray already, the constant Ray read then is corrected too."""
    os.environ.setdefault("RAY_worker_niceness", "0")  # see _normal_priority
    if not _is_loopback(address):
        return
    os.environ[RAY_CLUSTER_ENV] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def _check_reachable(address: str | None, timeout_s: float = 10.0) -> None:
    """Fails at once, in one line, for a ``host:port`` nobody answers at: Ray itself would retry for minutes."""
    if address in (None, "local", "auto") or "://" in address or ":" not in address:
        return
    import socket

    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"nothing answers at {address} ({exc})") from None


def ray_init(address: str | None = None, **kwargs):
    """The one way this project starts or joins Ray (the runner, tests, benchmarks).

    Without an address it starts a private local instance (``address="local"``)
    and never joins a cluster it happens to find on the machine. A local
    instance, or a cluster at a loopback address, binds to 127.0.0.1: no
    traffic goes to the machine's other interfaces. A remote cluster's address
    is used as given (the driver then runs on one of its nodes). Returns the
    ``ray`` module.
    """
    loopback_env(address)
    _check_reachable(address)
    import ray

    options = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False, **kwargs}
    if _is_loopback(address):
        options.setdefault("_node_ip_address", LOOPBACK)
    ray.init(address=address or "local", **options)
    return ray


class RayTransport:
    """Workers are Ray actors, on a private local instance or a cluster (``address``).

    Each actor asks for one CPU, and for one NeuronCore where the cluster has
    them (Ray then sets NEURON_RT_VISIBLE_CORES for the actor's process, so
    actors never share a core). The run's environment reaches the actor
    through ``runtime_env``, before torch is imported there. On a remote
    cluster neuron-validate must be installed on every node.
    """

    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self._owns_ray = False
        self._classes: dict[tuple, Any] = {}
        self.resources: dict[str, Any] = {}

    def connect(self):
        """Starts a private local Ray instance, or joins the cluster at ``address``; returns ``ray``."""
        loopback_env(self.address)
        try:
            import ray
        except ImportError:
            raise TransportError("--executor ray needs Ray: pip install 'neuron-validate[ray]'") from None
        if not ray.is_initialized():
            try:
                ray_init(self.address)
            except Exception as exc:  # noqa: BLE001 - any failure to reach the cluster is the user's to fix
                where = f"at --address {self.address}" if self.address else "locally"
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise TransportError(f"cannot start or reach a Ray cluster {where}: {type(exc).__name__}: {first}") from None
            self._owns_ray = True
        return ray

    def _actor_resources(self, ray, settings: RunSettings) -> dict[str, Any]:
        """One CPU and one device per actor: the run's device resource, which the cluster must offer, or a
        NeuronCore where the cluster has them."""
        name = settings.device_resource
        offered = ray.cluster_resources()
        if name:
            if offered.get(name, 0) < 1:
                where = f"at {self.address}" if self.address else "started locally"
                known = ", ".join(sorted(k for k in offered if not k.startswith("node:"))) or "none"
                how = "a GPU" if name == "GPU" else f"--resources '{{\"{name}\": N}}'"
                raise TransportError(f"--device-resource {name}: the Ray cluster {where} offers no {name!r} "
                                     f"(its resources: {known}); start each node with {how}")
            return {"num_cpus": 1, **({"num_gpus": 1} if name == "GPU" else {"resources": {name: 1}})}
        if offered.get(NEURON_RESOURCE, 0) >= 1:
            return {"num_cpus": 1, "resources": {NEURON_RESOURCE: 1}}
        return {"num_cpus": 1}

    def prepare(self, settings: list[RunSettings]) -> None:
        """Nothing to prepare: an actor starts with its own interpreter on its node."""

    def start(self, settings: RunSettings) -> _RayHandle:
        ray = self.connect()
        if not self.resources:
            self.resources = self._actor_resources(ray, settings)
        env = tuple(sorted(settings.worker_env().items()))
        if env not in self._classes:
            actor = type("CaseActor", (_RayWorker,), {"rss_mb": ray.method(concurrency_group="monitor")(_RayWorker.rss_mb)})
            self._classes[env] = ray.remote(
                max_restarts=0, max_task_retries=0, max_concurrency=1, concurrency_groups={"monitor": 1},
                runtime_env={"env_vars": dict(env)}, **self.resources,
            )(actor)
        return _RayHandle(self._classes[env], settings)

    def wait(self, handles: list[_RayHandle], timeout: float) -> None:
        import ray

        refs = [r for h in handles for r in h.refs()]
        if refs:
            ray.wait(refs, num_returns=1, timeout=timeout)
        else:
            time.sleep(timeout)

    def close(self) -> None:
        self._classes.clear()
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False


def make_transport(name: str, address: str | None = None) -> Transport:
    if name == "local":
        return ProcessTransport()
    if name == "ray":
        return RayTransport(address)
    raise ValueError(f"--executor {name!r}: expected local or ray")
