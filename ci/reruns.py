"""The gate's rerun policy: what a rerun runs with, and where its reproducers go.

A suite keeps workers alive across cases, which is what makes a sweep fast;
a rerun wants the opposite. A fault that strikes some processes and not
others (a race in the runtime, a device left in a bad state, the emulator's
``p=`` faults) is told apart from a real regression only by running the case
again in a process that shares nothing with the one that failed. So the gate
reruns on the runner's supervisor with ``fresh=True``: a process per job, with
the same crash, timeout, memory and probe rules as any run. The process that
saw a failure also writes its reproducer (the worker does so for every
failing case), with the very environment that failed.

Reruns rebuild the build's environment from its manifest (target, reference,
backend modules, and the environment variables that shape the backend), not
from the gate's own environment: the gate judges the build that was recorded.
"""

from __future__ import annotations

import re

from conformance.settings import EMULATOR_ENV, RunSettings

# Environment variables that place a process on a machine's devices rather than
# shape the backend's behaviour: a rerun takes the gate machine's own.
PLACEMENT_ENV = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "CUDA_VISIBLE_DEVICES")


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
