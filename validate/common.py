"""What the two sides' code (functions.py, training.py) share.

Each side runs in a worker of the runner's supervisor as a case of kind
``script-side`` whose config is a :class:`ChildSpec`, and returns its
observations with the same shape, so the findings are built the same way for
either convention. A problem with the user's script itself (it does not
import, names no model, fails on the reference) is a :class:`ScriptProblem`:
the command reports it in one line with exit code 2.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

# The model libraries a side's worker imports before it is forked (validate.script.PRELOADABLE), comma-separated
PRELOAD_ENV = "NEURON_VALIDATE_PRELOAD"

# Files the harness's own process writes while the sides run (the user's shell redirecting its output into
# a file of the working directory): "device:inode" pairs, set by validate.run; never the script's writes.
HARNESS_OUTPUTS_ENV = "NEURON_VALIDATE_HARNESS_OUTPUTS"


def harness_outputs() -> str:
    """This process's stdout and stderr, where they are files: the value of HARNESS_OUTPUTS_ENV."""
    ids = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            ids.append(f"{st.st_dev}:{st.st_ino}")
    return ",".join(ids)


class ScriptProblem(Exception):
    """The user's script or input is at fault (exit code 2), not the target."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpec:
    """What one side of a check runs: the config of its ``script-side`` case."""

    script: str
    convention: str
    side: str  # "target" | "reference" | "perturbed-K" (training convention); "both" (functions convention)
    target: str
    reference: str
    mode: str = "eager"
    steps: int | None = None
    steps_given: bool = False  # --steps on the command line: a script without backward() is an error then
    seed: int = 0
    out: str = ""  # the side's folder: its stdout.txt and stderr.txt
    script_args: tuple[str, ...] = ()
    localize: bool = True
    backend_modules: tuple[str, ...] = ()
    # A reference side run with the target's precision model perturbing its ops (side "perturbed-K"): its
    # losses widen the band of the curves (diff.curves). The model as PrecisionModel.to_dict().
    perturb_seed: int | None = None
    precision: dict | None = None
    nproc: int = 1  # ranks of a torchrun-style script on this side (validate.execute launches them)
    # Random draws (diff.draws): "shared", the target takes every draw from the CPU's generator (the
    # reference's numbers); "own", the target draws from its own stream. ``own_stream``: indices of the
    # draws a reference side ("stream-K") takes from a generator of its own, seeded by ``perturb_seed``:
    # the device's own stream modelled on the CPU.
    draws: str = "shared"
    own_stream: tuple[int, ...] = ()
    # The device type the script names for its device ("neuron", or "cuda" for a script written for CUDA): on
    # each side it means that side's device (validate.named_device).
    device_alias: str | None = None

    def to_config(self) -> dict:
        data = asdict(self)
        data["script_args"] = list(self.script_args)
        data["backend_modules"] = list(self.backend_modules)
        data["own_stream"] = list(self.own_stream)
        return data

    @classmethod
    def from_config(cls, data: dict) -> "ChildSpec":
        data = dict(data)
        data["script_args"] = tuple(data.get("script_args", ()))
        data["backend_modules"] = tuple(data.get("backend_modules", ()))
        data["own_stream"] = tuple(data.get("own_stream", ()))
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(kw_only=True)
class SideObservations:
    """One side's observations (see checks.py for what each key means)."""

    ran: bool = False
    error: dict | None = None
    curve: dict | None = None
    seconds: float = 0.0
    fingerprints: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"ran": self.ran, "error": self.error, "curve": self.curve, "seconds": self.seconds,
                "fingerprints": self.fingerprints, **self.extra}


def json_ready(value: Any) -> Any:
    """Observations as JSON would carry them: non-finite floats as None, sets and tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_ready(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def localization_observations(model, args, kwargs, *, target, reference, loss_fn=None, grad_output=None,
                              files=(), call=None) -> dict:
    """Runs diff.localize on the target and turns its trace into placement events; JSON-ready."""
    from diff.localize import ReferenceFailure, localize
    from diff.precision import model_for

    from .probes import placement_from_trace

    try:
        loc = localize(model, args, kwargs, target_device=target.device, reference_device=reference.device,
                       loss_fn=loss_fn, grad_output=grad_output, source_files=files, call=call,
                       precision=model_for(target))
    except ReferenceFailure as exc:
        return {"localization": None, "placement_events": [],
                "localization_error": str(exc) + (f" at {exc.source}" if exc.source else "")}
    sources: dict[str, list[str]] = {}
    for event in loc.trace:
        if event.source is not None:
            seen = sources.setdefault(event.op, [])
            if str(event.source) not in seen and len(seen) < 3:
                seen.append(str(event.source))
    return {"localization": loc.to_dict(), "placement_events": placement_from_trace(loc.trace, target.device.type),
            "op_sources": sources}
