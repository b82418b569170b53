"""What a localisation finds: layers, ops, the target's trace, and the verdict on outputs and gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..compare import Comparison
from .source import SourceLine

ROOT = "(model)"  # display name of the root module
PHASES = ("forward", "backward")


def finite_or_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


class ReferenceFailure(Exception):
    """The model raised on the reference side: the script is broken, not the target."""

    def __init__(self, message: str, *, module: str | None, source: "SourceLine | None") -> None:
        super().__init__(message)
        self.module = module
        self.source = source



@dataclass(frozen=True, slots=True, kw_only=True)
class LayerError:
    """One module call on one pass: did the target's value there pass, and by how much did it differ."""

    module: str
    type: str
    call: int
    phase: str  # forward: the module's output; backward: the gradient flowing into that output
    ok: bool
    max_abs: float
    rel_error: float  # target RMSE against the golden (else the reference), over the RMS of that value
    reference_rel_error: float  # the reference's own RMSE against the golden, same scale (nan without a golden)
    message: str = ""
    random: bool = False  # two reference runs differ here: not judged (``ok`` says nothing)

    @property
    def label(self) -> str:
        call = f" call {self.call + 1}" if self.call else ""
        return f"{self.module} ({self.type}){call}"

    def to_dict(self) -> dict:
        return {
            "module": self.module, "type": self.type, "call": self.call, "phase": self.phase, "ok": self.ok,
            "max_abs": finite_or_none(self.max_abs), "rel_error": finite_or_none(self.rel_error),
            "reference_rel_error": finite_or_none(self.reference_rel_error), "message": self.message, "label": self.label,
            "random": self.random,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class OpError:
    """One ATen op of the drilled-into module, compared across sides."""

    index: int
    op: str
    module: str  # the innermost module whose code called the op
    source: SourceLine | None
    ok: bool
    max_abs: float
    scale_error: float  # greatest absolute difference over the greatest magnitude of the golden (or reference)
    message: str = ""

    def to_dict(self) -> dict:
        return {
            "index": self.index, "op": self.op, "module": self.module,
            "source": self.source.to_dict() if self.source else None,
            "ok": self.ok, "max_abs": finite_or_none(self.max_abs), "scale_error": finite_or_none(self.scale_error),
            "message": self.message,
        }


@dataclass(kw_only=True, slots=True)
class OpDivergence:
    """The ops of one module call, run alone on every side with the reference's inputs."""

    module: str
    call: int
    phase: str
    ops: list[OpError] = field(default_factory=list)
    note: str = ""
    # The module's ops differ from the reference's inputs, but no single op can be named (they follow kernels
    # the reference does not run): its parent is not drilled.
    unnamed: bool = False

    @property
    def first(self) -> OpError | None:
        return next((o for o in self.ops if not o.ok), None)

    def to_dict(self) -> dict:
        first = self.first
        return {"module": self.module, "call": self.call, "phase": self.phase, "note": self.note,
                "first": first.to_dict() if first else None, "ops": [o.to_dict() for o in self.ops]}


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEvent:
    """One ATen op seen on the target during the forward pass (no values kept)."""

    op: str
    source: SourceLine | None
    module: str | None  # innermost module running when the op ran
    input_devices: tuple[str, ...]
    output_devices: tuple[str, ...]
    cpu_inputs: int  # CPU tensors of one or more dimensions among the inputs (0-dim ones are scalars)
    factory: bool  # no tensor inputs: the op created its outputs
    failed: bool = False

    def to_dict(self) -> dict:
        return {"op": self.op, "source": self.source.to_dict() if self.source else None, "module": self.module,
                "input_devices": list(self.input_devices), "output_devices": list(self.output_devices),
                "cpu_inputs": self.cpu_inputs, "factory": self.factory, "failed": self.failed}


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetFailure:
    """The target raised while running the model."""

    message: str
    phase: str
    module: str | None
    op: str | None
    source: SourceLine | None

    def to_dict(self) -> dict:
        return {"message": self.message, "phase": self.phase, "module": self.module, "op": self.op,
                "source": self.source.to_dict() if self.source else None}


@dataclass(kw_only=True, slots=True)
class Localization:
    """Truthy when the target's outputs and gradients pass; otherwise says where they first went wrong."""

    outputs: Comparison | None = None
    gradients: Comparison | None = None
    layers: list[LayerError] = field(default_factory=list)
    first_forward: LayerError | None = None
    first_backward: LayerError | None = None
    backward_culprit: str | None = None  # the module whose backward produced the first wrong gradient
    backward_culprit_call: int = 0
    ops: OpDivergence | None = None
    trace: list[TraceEvent] = field(default_factory=list)
    target_failure: TargetFailure | None = None
    golden: bool = True
    reference_deterministic: bool = True
    host_copies: dict[str, int] = field(default_factory=dict)  # op -> host<->device copies inside it (target run)
    notes: list[str] = field(default_factory=list)
    draws: int = 0  # random draws of the compared call, shared by every side (diff.draws)

    def __bool__(self) -> bool:
        if self.target_failure is not None:
            return False
        if not self.reference_deterministic:
            # The outputs are noise against noise; the layers the reference reproduces are all there is.
            return self.first_forward is None and self.first_backward is None
        return (self.outputs is not None and bool(self.outputs)
                and (self.gradients is None or bool(self.gradients)))

    @property
    def compared_layers(self) -> int:
        """Layer values judged (both passes); layers where the reference does not reproduce itself are not."""
        return sum(1 for layer in self.layers if not layer.random)

    @property
    def first(self) -> LayerError | None:
        return self.first_forward or self.first_backward

    @property
    def culprit(self) -> str | None:
        """The module whose own code holds the first diverging op (else the first diverging module)."""
        op = self.ops.first if self.ops else None
        if op is not None:
            return op.module
        first = self.first
        return first.module if first else None

    def summary(self) -> str:
        if self.target_failure is not None:
            f = self.target_failure
            where = f" in {f.module}" if f.module else ""
            at = f" at {f.source}" if f.source else ""
            return f"the target raised{where}{at}: {f.message}"
        if self and not self.reference_deterministic:
            return (f"inconclusive: the reference does not reproduce itself; the {self.compared_layers} layer values "
                    "it reproduces match")
        if self:
            return "outputs and gradients match"
        first = self.first
        if first is None:
            return self.outputs.summary() if self.outputs is not None and not self.outputs else "gradients differ"
        op = self.ops.first if self.ops else None
        pass_ = "forward" if first.phase == "forward" else "backward"
        if op is None:
            return f"first diverging layer ({pass_}): {first.label}"
        text = f"first diverging layer ({pass_}): {op.module}, op {op.op}" + (f" at {op.source}" if op.source else "")
        if op.module != first.module:
            text += f" (first diverging {'output' if first.phase == 'forward' else 'gradient'}: {first.label})"
        return text

    def to_dict(self) -> dict:
        return {
            "ok": bool(self),
            "summary": self.summary(),
            "outputs": self.outputs.to_dict() if self.outputs is not None else None,
            "gradients": self.gradients.to_dict() if self.gradients is not None else None,
            "layers": [layer.to_dict() for layer in self.layers],
            "first_forward": self.first_forward.to_dict() if self.first_forward else None,
            "first_backward": self.first_backward.to_dict() if self.first_backward else None,
            "backward_culprit": self.backward_culprit,
            "culprit": self.culprit,
            "ops": self.ops.to_dict() if self.ops else None,
            "target_failure": self.target_failure.to_dict() if self.target_failure else None,
            "golden": self.golden,
            "reference_deterministic": self.reference_deterministic,
            "compared_layers": self.compared_layers,
            "host_copies": dict(self.host_copies),
            "random_layers": [layer.label for layer in self.layers if layer.random and layer.phase == "forward"],
            "draws": self.draws,
            "notes": list(self.notes),
        }

