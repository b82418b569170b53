"""Run settings: everything a worker process needs to run cases the same way
as the process that started it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

EMULATOR_ENV = ("NEURON_VALIDATE_EMULATOR_PROFILE", "NEURON_VALIDATE_FAULTS", "NEURON_VALIDATE_EMULATOR_AUTOLOAD")
BACKEND_MODULES_ENV = "NEURON_VALIDATE_BACKEND_MODULES"
COMPILE_CACHE_ENV = "NEURON_VALIDATE_COMPILE_CACHE"  # read by emulator/compile_backend.py (a layer below)
PRECISION_MODEL_ENV = "NEURON_VALIDATE_PRECISION_MODEL"  # read by diff/precision.py


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    target: str = "neuron"
    reference: str = "cpu"
    backend_modules: tuple[str, ...] = ()
    timeout_s: float = 120.0
    rss_limit_mb: int = 4096
    # The run's cap where this worker was given more (the sides of a case apart, runner/supervisor.py): what a
    # case is judged against ("needs more than the cap"), so that its verdict does not depend on the path it took.
    run_cap_mb: int | None = None
    artifacts_dir: str | None = None  # reproducers go here
    reference_cache: str | None = None  # SQLite file of cached reference outputs
    env: dict[str, str] = field(default_factory=dict)  # set in workers before torch is imported
    # Kinds of case whose warm-up a worker runs before it reports ready (loading op_db, ...), so that
    # the first case's timeout measures the case, not the worker's start-up.
    warmup: tuple[str, ...] = ()
    # Intra-op threads per worker (0: PyTorch's default). Workers that together use more threads than
    # the machine has cores only wait for each other; see default_threads.
    threads: int = 0
    # Reproducers: at most this many bytes of saved inputs per case; failing samples shrunk first.
    repro_max_bytes: int = 2**20
    shrink: bool = True
    # A Ray resource each worker takes one of: one device per actor (``neuron_cores`` on a Trainium host, which
    # offers 32; ``GPU``). None: a NeuronCore where the cluster has them, else only a CPU (runner/transports.py).
    device_resource: str | None = None

    def worker_env(self) -> dict[str, str]:
        """The environment a worker needs: emulator profile and faults, backend modules."""
        env = {k: os.environ[k] for k in EMULATOR_ENV if k in os.environ}
        if self.artifacts_dir:  # what the build compiled, reused by its reruns (emulator/compile_backend.py)
            env[COMPILE_CACHE_ENV] = os.path.join(self.artifacts_dir, "compile-cache")
        if self.backend_modules:
            env[BACKEND_MODULES_ENV] = ",".join(self.backend_modules)
            env.setdefault("NEURON_VALIDATE_EMULATOR_AUTOLOAD", "0")
        env.update(self.env)
        return env


def default_threads(jobs: int) -> int:
    """One share of the cores per worker: ``jobs`` workers on a 2-core machine with -j 2 get one thread each."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, jobs))
