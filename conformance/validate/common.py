"""What the two child programs (worker: functions convention; bootstrap: training scripts) share.

Both receive a JSON spec, run the user's code in their own process, and write
``result.json`` with the same shape, so the parent builds findings the same
way for either convention. A problem with the user's script itself (it does
not import, names no model, fails on the reference) is a :class:`ScriptProblem`:
the parent reports it in one line with exit code 2.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULT_FILE = "result.json"


class ScriptProblem(Exception):
    """The user's script or input is at fault (exit code 2), not the target."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildSpec:
    """What the parent asks a child process to do; written as JSON next to its result."""

    script: str
    convention: str
    side: str  # "target" | "reference" (training convention); "both" (functions convention)
    target: str
    reference: str
    mode: str = "eager"
    steps: int | None = None
    steps_given: bool = False  # --steps on the command line: a script without backward() is an error then
    seed: int = 0
    out: str = ""
    progress: str = ""
    script_args: tuple[str, ...] = ()
    localize: bool = True
    backend_modules: tuple[str, ...] = ()
    threads: int = 0

    def to_json(self) -> str:
        from dataclasses import asdict

        data = asdict(self)
        data["script_args"] = list(self.script_args)
        data["backend_modules"] = list(self.backend_modules)
        return json.dumps(data, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ChildSpec":
        data = json.loads(Path(path).read_text())
        data["script_args"] = tuple(data.get("script_args", ()))
        data["backend_modules"] = tuple(data.get("backend_modules", ()))
        return cls(**data)


@dataclass(kw_only=True)
class SideResult:
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


def write_result(out: str, data: dict[str, Any]) -> None:
    path = Path(out) / RESULT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_default))
    tmp.replace(path)


def _default(value):
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def set_threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def localization_observations(model, args, kwargs, *, target, reference, loss_fn=None, grad_output=None,
                              files=(), call=None) -> dict:
    """Runs diff.localize on the target and turns its trace into placement events; JSON-ready."""
    from diff.localize import ReferenceFailure, localize

    from .probes import placement_from_trace

    try:
        loc = localize(model, args, kwargs, target_device=target.device, reference_device=reference.device,
                       loss_fn=loss_fn, grad_output=grad_output, source_files=files, call=call)
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
