"""Divergence localisation: the first module, then the first ATen op, where a target departs.

A whole-model comparison says *that* a target computes something else; a
migrating team needs to know *where*. Like Polygraphy marking every tensor as
an output, :func:`localize` runs the model three times, on the reference
(CPU float32), on the target, and as a float64 golden copy on the CPU, and
records every module's output in the forward pass and the gradient flowing
into that output in the backward pass. Module calls are compared in the order
they complete (children before their parent, so the innermost culprit comes
first) with the suites' float64 golden rule (:func:`diff.compare`), which gives
the first diverging module and how the error grows with depth.

It then drills into that module: the module alone is run on every side with
the *reference's* inputs to it, under a TorchDispatchMode that records each
ATen op, its outputs and the user's source line. With identical inputs, the
first op whose output fails the golden rule is the op that went wrong, not
one that inherited an upstream error. Op sequences are paired with difflib,
so a backend that picks another kernel sequence (an SDPA variant, say) is
still compared op by op where the sequences agree.

The same dispatch trace of the target's forward also tells which ops mixed a
CPU tensor into device ops, created tensors on the CPU or copied to the host;
the migration checks read those from :attr:`Localization.trace`.
"""

from __future__ import annotations

import copy
import difflib
import math
import os
import sys
import sysconfig
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

from .compare import Comparison, compare
from .tolerances import TolerancePolicy

ROOT = "(model)"  # display name of the root module
PHASES = ("forward", "backward")
DEFAULT_RECORD_BYTES = 512 * 2**20

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HARNESS_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
    for d in ("diff", "conformance")
)
_STDLIB_DIRS = tuple({sysconfig.get_paths()["stdlib"] + os.sep, sysconfig.get_paths()["platstdlib"] + os.sep})
_LIBRARY_DIRS = (_TORCH_DIR, *_HARNESS_DIRS, *_STDLIB_DIRS)


class ReferenceFailure(Exception):
    """The model raised on the reference side: the script is broken, not the target."""

    def __init__(self, message: str, *, module: str | None, source: "SourceLine | None") -> None:
        super().__init__(message)
        self.module = module
        self.source = source


# ---------------------------------------------------------------- result types
@dataclass(frozen=True, slots=True, kw_only=True)
class SourceLine:
    """Where in the user's code an op was called."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{_short_path(self.file)}:{self.line} in {self.function}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function, "text": str(self)}


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

    @property
    def label(self) -> str:
        call = f" call {self.call + 1}" if self.call else ""
        return f"{self.module} ({self.type}){call}"

    def to_dict(self) -> dict:
        return {
            "module": self.module, "type": self.type, "call": self.call, "phase": self.phase, "ok": self.ok,
            "max_abs": _finite(self.max_abs), "rel_error": _finite(self.rel_error),
            "reference_rel_error": _finite(self.reference_rel_error), "message": self.message, "label": self.label,
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
            "ok": self.ok, "max_abs": _finite(self.max_abs), "scale_error": _finite(self.scale_error),
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
    notes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return (self.target_failure is None and self.outputs is not None and bool(self.outputs)
                and (self.gradients is None or bool(self.gradients)))

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
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------- source lines
def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARY_DIRS) or filename.startswith("<")


def find_source(frames: Iterable[tuple[str, int, str]], source_files: frozenset[str]) -> SourceLine | None:
    """The innermost frame in the user's files, else the innermost frame outside torch, the harness and the stdlib.

    ``frames`` run from the innermost outward.
    """
    fallback = None
    for filename, line, function in frames:
        if filename in source_files:
            return SourceLine(file=filename, line=line, function=function)
        if fallback is None and not _is_library(filename):
            fallback = SourceLine(file=filename, line=line, function=function)
    return fallback


def _python_frames(start) -> Iterable[tuple[str, int, str]]:
    frame = start
    while frame is not None:
        yield os.path.abspath(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back


def _traceback_frames(text: str) -> list[tuple[str, int, str]]:
    """Frames of an anomaly-mode traceback string, innermost first."""
    frames = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            try:
                name, rest = line[6:].split('", line ', 1)
                number, _, function = rest.partition(", in ")
                frames.append((os.path.abspath(name), int(number), function.strip()))
            except ValueError:
                continue
    return frames[::-1]


def current_source(source_files: frozenset[str]) -> SourceLine | None:
    """The user's source line of the op running now (forward), or of the forward op behind a backward node."""
    node = torch._C._current_autograd_node()
    if node is not None:
        tb = node.metadata.get("traceback_") if hasattr(node, "metadata") else None
        if isinstance(tb, (list, tuple)):  # anomaly mode keeps traceback.format_stack()'s lines
            tb = "".join(tb)
        if isinstance(tb, str):
            return find_source(_traceback_frames(tb), source_files)
        return None
    return find_source(_python_frames(sys._getframe(2)), source_files)


# ---------------------------------------------------------------- op tracing
@dataclass(slots=True)
class _OpEvent:
    op: str
    source: SourceLine | None
    module: str | None
    outputs: list[torch.Tensor | None]


def _tensors(value) -> list[torch.Tensor]:
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


class OpTracer(TorchDispatchMode):
    """Records every ATen op dispatched while active: its name, devices, source line and (optionally) outputs."""

    def __init__(self, *, keep_outputs: bool = False, source_files: Iterable[str] = (),
                 module_of: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.keep_outputs = keep_outputs
        self.source_files = frozenset(os.path.abspath(f) for f in source_files)
        self.module_of = module_of
        self.events: list[TraceEvent] = []
        self.values: list[_OpEvent] = []
        self.paused = 0

    @contextmanager
    def pause(self):
        """Ops the harness itself runs (copies in hooks) are not the model's."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception:
            self._record(func, args, kwargs, None, failed=True)
            raise
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out, *, failed: bool = False) -> None:
        name = func._schema.name
        source = current_source(self.source_files)
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out) if out is not None else []
        devices_in = tuple(sorted({t.device.type for t in inputs}))
        self.events.append(TraceEvent(
            op=name, source=source, module=self.module_of() if self.module_of else None,
            input_devices=devices_in, output_devices=tuple(sorted({t.device.type for t in outputs})),
            cpu_inputs=sum(1 for t in inputs if t.device.type == "cpu" and t.dim() > 0),
            factory=not inputs, failed=failed,
        ))
        if self.keep_outputs and not failed:
            self.values.append(_OpEvent(op=name, source=source, module=self.events[-1].module,
                                        outputs=[_to_cpu(t) for t in outputs]))


# ---------------------------------------------------------------- helpers
def _to_cpu(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.to("cpu", copy=True)


def _finite(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _move(value, device, *, double: bool = False):
    def move(v):
        if not isinstance(v, torch.Tensor):
            return v
        v = v.detach()
        if double and v.is_floating_point():
            v = v.to(torch.float64)
        return v.to(device)

    return tree_map(move, value)


def _float_leaves(value) -> list[torch.Tensor]:
    return [t for t in _tensors(value) if t.is_floating_point() or t.is_complex()]


def _rel(values: Sequence[torch.Tensor | None], against: Sequence[torch.Tensor | None]) -> float:
    """RMS of ``values - against`` over the RMS of ``against``, across all real float leaves (finite elements)."""
    sq_err = sq_ref = 0.0
    count = 0
    for a, b in zip(values, against):
        if a is None or b is None or a.shape != b.shape or not b.is_floating_point() or not b.numel():
            continue
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        finite = torch.isfinite(a64) & torch.isfinite(b64)
        sq_err += float(((a64 - b64)[finite] ** 2).sum())
        sq_ref += float((b64[finite] ** 2).sum())
        count += int(finite.sum())
    if count == 0:
        return 0.0
    return math.sqrt(sq_err / sq_ref) if sq_ref > 0 else (0.0 if sq_err == 0 else math.inf)


def _scale_error(values: Sequence[torch.Tensor | None], against: Sequence[torch.Tensor | None]) -> tuple[float, float]:
    """(greatest absolute difference, that over the greatest finite magnitude of ``against``)."""
    worst = scale = 0.0
    for a, b in zip(values, against):
        if a is None or b is None or a.shape != b.shape or not (b.is_floating_point()):
            continue
        if b.numel() == 0:
            continue
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        finite = torch.isfinite(a64) & torch.isfinite(b64)
        if bool(finite.any()):
            worst = max(worst, float((a64 - b64).abs()[finite].max()))
            scale = max(scale, float(b64.abs()[finite].max()))
    return worst, (worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


# ---------------------------------------------------------------- module recording
@dataclass(slots=True)
class _Call:
    name: str
    type: str
    call: int
    outputs: list[torch.Tensor | None]
    grads: list[torch.Tensor | None]
    parent: tuple[str, int] | None = None  # the enclosing module call


class _Recorder:
    """Forward hooks on every module: outputs in completion order, gradients into them, the module stack."""

    def __init__(self, model: torch.nn.Module, *, tracer: OpTracer | None = None,
                 max_bytes: int = DEFAULT_RECORD_BYTES, capture: tuple[str, int] | None = None,
                 prefix: str = "") -> None:
        self.calls: list[_Call] = []
        self.stack: list[tuple[str, int]] = []  # (module, its call index) of the calls in progress
        self.counts: dict[str, int] = {}
        self.tracer = tracer
        self.handles = []
        self.budget = max_bytes
        self.truncated = False
        self.capture = capture
        self.captured: tuple[tuple, dict] | None = None
        for name, module in model.named_modules():
            label = ".".join(p for p in (prefix, name) if p) or ROOT
            self.handles.append(module.register_forward_pre_hook(self._pre(label), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post(label)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def current(self) -> str | None:
        return self.stack[-1][0] if self.stack else None

    def _paused(self):
        return self.tracer.pause() if self.tracer is not None else nullcontext()

    def _pre(self, name: str):
        def hook(module, args, kwargs):
            self.stack.append((name, self.counts.get(name, 0)))
            if self.capture is not None and self.capture[0] == name and self.counts.get(name, 0) == self.capture[1]:
                with self._paused():
                    self.captured = (_move(args, "cpu"), _move(kwargs, "cpu"))
                raise _Captured()
            return None

        return hook

    def _post(self, name: str):
        def hook(module, args, output):
            parent = None
            if self.stack and self.stack[-1][0] == name:
                self.stack.pop()
                parent = self.stack[-1] if self.stack else None
            call = self.counts.get(name, 0)
            self.counts[name] = call + 1
            leaves = _tensors(output)
            with self._paused():
                outputs: list[torch.Tensor | None] = []
                for t in leaves:
                    size = t.numel() * t.element_size()
                    if self.budget - size < 0:
                        self.truncated = True
                        outputs.append(None)
                    else:
                        self.budget -= size
                        outputs.append(_to_cpu(t))
            record = _Call(name=name, type=type(module).__name__, call=call, outputs=outputs, grads=[None] * len(leaves),
                           parent=parent)
            index = len(self.calls)
            self.calls.append(record)
            for j, t in enumerate(leaves):
                if t.requires_grad and (t.is_floating_point() or t.is_complex()):
                    t.register_hook(self._grad_hook(index, j))
            return None

        return hook

    def _grad_hook(self, index: int, j: int):
        def hook(grad):
            with self._paused():
                self.calls[index].grads[j] = _to_cpu(grad)
            return None

        return hook


class _Captured(Exception):
    """Stops a forward once the inputs of the drilled-into module are captured."""


@dataclass(slots=True)
class _SideRun:
    calls: list[_Call]
    output: Any = None
    param_grads: dict[str, torch.Tensor] | None = None
    error: BaseException | None = None
    error_phase: str = "forward"
    error_module: str | None = None
    tracer: OpTracer | None = None
    truncated: bool = False


LossFn = Callable[[Any], torch.Tensor]


def _backward(output, loss_fn: LossFn | None, grad_output, device, *, double: bool) -> bool:
    """Runs the backward pass from the loss, or from a given gradient of the output; False when neither applies."""
    if loss_fn is not None:
        loss = loss_fn(output)
        if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
            return False
        loss.backward()
        return True
    if grad_output is None:
        return False
    grads = list(grad_output) if isinstance(grad_output, (list, tuple)) else [grad_output]
    pairs = [(o, g) for o, g in zip(_float_leaves(output), grads)
             if g is not None and o.requires_grad and g.shape == o.shape]
    if not pairs:
        return False
    torch.autograd.backward([o for o, _ in pairs], [_move(g, device, double=double).to(o.dtype) for o, g in pairs])
    return True


@contextmanager
def _default_dtype(dtype: torch.dtype | None):
    if dtype is None:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _run_side(model: torch.nn.Module, args, kwargs, *, device, double: bool, loss_fn, grad_output,
              trace: bool, source_files, max_bytes: int, call: Callable | None) -> _SideRun:
    m = copy.deepcopy(model).to(device)
    if double:
        m = m.double()
    a, k = _move(args, device, double=double), _move(kwargs, device, double=double)
    tracer = OpTracer(source_files=source_files) if trace else None
    recorder = _Recorder(m, tracer=tracer, max_bytes=max_bytes)
    if tracer is not None:
        tracer.module_of = recorder.current
    run = _SideRun(calls=recorder.calls, tracer=tracer)
    with _default_dtype(torch.float64 if double else None):
        try:
            with tracer if tracer is not None else nullcontext():
                output = (call or _call_model)(m, a, k)
            run.output = output
        except Exception as exc:  # noqa: BLE001 - a failing side is a result
            run.error, run.error_phase, run.error_module = exc, "forward", recorder.current()
            recorder.remove()
            return run
        try:
            did = _backward(output, loss_fn, grad_output, device, double=double)
        except Exception as exc:  # noqa: BLE001
            run.error, run.error_phase = exc, "backward"
            did = False
    recorder.remove()
    run.truncated = recorder.truncated
    if did:
        run.param_grads = {n: _to_cpu(p.grad) for n, p in m.named_parameters() if p.grad is not None}
    return run


def _call_model(model, args, kwargs):
    return model(*args, **kwargs)


# ---------------------------------------------------------------- the entry point
def localize(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    target_device: str | torch.device,
    reference_device: str | torch.device = "cpu",
    loss_fn: LossFn | None = None,
    grad_output: Any = None,
    tolerance=None,
    golden: bool = True,
    drill: bool = True,
    source_files: Iterable[str] = (),
    max_record_bytes: int = DEFAULT_RECORD_BYTES,
    call: Callable[[torch.nn.Module, tuple, dict], Any] | None = None,
) -> Localization:
    """Compares ``model(*args, **kwargs)`` module by module on the target against the reference.

    ``model`` is left untouched (every side runs a deep copy). The backward
    pass starts from ``loss_fn(output)`` (a scalar) or, where the loss is not
    known (an unchanged training script), from ``grad_output``, the gradient
    the script's own loss sent into the output: a list aligned with the
    output's floating-point tensors in pytree order, None where none flowed;
    with neither, only the forward pass is compared. ``tolerance`` is a dtype -> Tolerance function
    (default: the model-scope policy). ``source_files`` are the user's files,
    preferred when naming an op's source line. Raises ReferenceFailure when
    the model fails on the reference.
    """
    kwargs = dict(kwargs or {})
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    tol = tolerance or TolerancePolicy().for_dtype(type(model).__name__, scope="model")
    files = tuple(os.path.abspath(f) for f in source_files)
    common = dict(loss_fn=loss_fn, grad_output=grad_output, source_files=files, max_bytes=max_record_bytes, call=call)
    target_device = torch.device(target_device)
    result = Localization()

    ref = _run_side(model, args, kwargs, device=reference_device, double=False, trace=False, **common)
    if ref.error is not None:
        source = find_source(_exception_frames(ref.error), frozenset(files))
        where = f" in {ref.error_module}" if ref.error_module else ""
        raise ReferenceFailure(f"the model raised on the reference{where} ({ref.error_phase}): {_one_line(ref.error)}",
                               module=ref.error_module, source=source)
    again = _run_side(model, args, kwargs, device=reference_device, double=False, trace=False,
                      **{**common, "loss_fn": None, "grad_output": None})
    ref_out, again_out = _tensors(ref.output), _tensors(again.output)
    result.reference_deterministic = len(ref_out) == len(again_out) and all(
        torch.equal(_to_cpu(a), _to_cpu(b)) for a, b in zip(ref_out, again_out) if a.dtype == b.dtype)
    if not result.reference_deterministic:
        result.notes.append("two reference runs differ: the model draws random numbers or is not deterministic in forward")

    gold = None
    if golden:
        gold = _run_side(model, args, kwargs, device="cpu", double=True, trace=False, **common)
        if gold.error is not None:
            result.notes.append(f"no float64 golden: the model fails in float64 ({_one_line(gold.error)})")
            gold = None
    result.golden = gold is not None

    tgt = _run_side(model, args, kwargs, device=target_device, double=False, trace=True, **common)
    result.trace = list(tgt.tracer.events) if tgt.tracer else []
    if tgt.truncated or ref.truncated:
        result.notes.append(f"module outputs beyond {max_record_bytes >> 20} MiB were not kept")
    if tgt.error is not None:
        failing = next((e for e in reversed(result.trace) if e.failed), None)
        result.target_failure = TargetFailure(
            message=_one_line(tgt.error), phase=tgt.error_phase, module=tgt.error_module,
            op=failing.op if failing else None,
            source=(failing.source if failing and failing.source else find_source(_exception_frames(tgt.error), frozenset(files))),
        )

    _compare_layers(result, ref, tgt, gold, tol)
    if tgt.error is None:
        golden_out = _tensors(gold.output) if gold else None
        result.outputs = compare([_to_cpu(t) for t in _tensors(tgt.output)], [_to_cpu(t) for t in ref_out],
                                 golden=[_to_cpu(t) for t in golden_out] if golden_out else None, tolerance=tol)
        if ref.param_grads is not None and tgt.param_grads is not None:
            result.gradients = compare(tgt.param_grads, ref.param_grads,
                                       golden=gold.param_grads if gold and gold.param_grads else None,
                                       tolerance=tol, path="grad")
    if drill and result.target_failure is None:
        first = result.first_forward
        phase, name, call_index = None, None, 0
        if first is not None:
            phase, name, call_index = "forward", first.module, first.call
        elif result.backward_culprit is not None:
            phase, name = "backward", result.backward_culprit
            call_index = result.backward_culprit_call
        if phase is not None:
            sources: dict[tuple[str | None, str], SourceLine] = {}
            for event in result.trace:
                if event.source is not None:
                    sources.setdefault((event.module, event.op), event.source)
            result.ops = _locate_op(model, args, kwargs, name=name, call=call_index, phase=phase, ref=ref,
                                    target_device=target_device, reference_device=reference_device, golden=golden,
                                    tol=tol, files=files, call_fn=call, sources=sources)
    return result


def _locate_op(model, args, kwargs, *, name: str, call: int, ref: _SideRun, **options) -> OpDivergence:
    """Drills into the module call, then into its enclosing calls, until one of them holds a diverging op.

    A module that computes correctly from the reference's inputs received wrong inputs: the error entered
    in its parent's own code (a functional op between two submodules), so the parent is drilled next.
    """
    parents = {(c.name, c.call): c.parent for c in ref.calls}
    tried: list[str] = []
    current: tuple[str, int] | None = (name, call)
    result = None
    while current is not None:
        result = _drill(model, args, kwargs, name=current[0], call=current[1], ref=ref, **options)
        if result.first is not None:
            if tried:
                result.note = (f"{', '.join(tried)} compute{'s' if len(tried) == 1 else ''} correctly from the "
                               f"reference's inputs: the error enters in {current[0]}'s own code")
            return result
        tried.append(current[0])
        current = parents.get(current)
    assert result is not None
    result.module, result.call = name, call
    return result


def _exception_frames(exc: BaseException) -> list[tuple[str, int, str]]:
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno, tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    return frames[::-1]


def _compare_layers(result: Localization, ref: _SideRun, tgt: _SideRun, gold: _SideRun | None, tol) -> None:
    n = min(len(ref.calls), len(tgt.calls))
    gold_ok = gold is not None and [(c.name, c.call) for c in gold.calls] == [(c.name, c.call) for c in ref.calls]
    if gold is not None and not gold_ok:
        result.notes.append("the float64 golden run took another path through the modules; layers compared against the reference only")
    forward: list[LayerError] = []
    for i in range(n):
        r, t = ref.calls[i], tgt.calls[i]
        if (r.name, r.call) != (t.name, t.call):
            result.notes.append(f"the target ran {t.name} where the reference ran {r.name} (module call {i}); "
                                "later layers are not compared")
            n = i
            break
        g = gold.calls[i] if gold_ok else None
        forward.append(_layer_error(r, t, g, "forward", r.outputs, t.outputs, g.outputs if g else None, tol))
    backward: list[LayerError] = []
    have_grads = any(x is not None for c in ref.calls for x in c.grads)
    if have_grads and tgt.error is None:
        for i in reversed(range(n)):
            r, t = ref.calls[i], tgt.calls[i]
            if all(x is None for x in r.grads):
                continue
            g = gold.calls[i] if gold_ok else None
            backward.append(_layer_error(r, t, g, "backward", r.grads, t.grads, g.grads if g else None, tol))
    result.layers = forward + backward
    result.first_forward = next((x for x in forward if not x.ok), None)
    if result.first_forward is None:
        result.first_backward = next((x for x in backward if not x.ok), None)
        if result.first_backward is not None:
            # The wrong gradient into D's output was computed by the backward of the module that ran
            # right after D in the forward pass (completion order): drill into that one.
            index = next(i for i in range(n) if (ref.calls[i].name, ref.calls[i].call) ==
                         (result.first_backward.module, result.first_backward.call))
            after = ref.calls[index + 1] if index + 1 < n else None
            if after is not None:
                result.backward_culprit = after.name
                result.backward_culprit_call = after.call


def _layer_error(r: _Call, t: _Call, g: _Call | None, phase: str, rv, tv, gv, tol) -> LayerError:
    pairs = [(a, b, (gv[j] if gv is not None and j < len(gv) else None))
             for j, (a, b) in enumerate(zip(tv, rv)) if a is not None and b is not None]
    if not pairs:
        return LayerError(module=r.name, type=r.type, call=r.call, phase=phase, ok=True, max_abs=0.0,
                          rel_error=0.0, reference_rel_error=math.nan)
    actual = [a for a, _, _ in pairs]
    expected = [b for _, b, _ in pairs]
    golden = [c for _, _, c in pairs] if gv is not None and all(c is not None for _, _, c in pairs) else None
    cmp = compare(actual, expected, golden=golden, tolerance=tol, path=r.name)
    against = golden if golden is not None else expected
    return LayerError(
        module=r.name, type=r.type, call=r.call, phase=phase, ok=bool(cmp),
        max_abs=cmp.worst.get("max_abs", 0.0),
        rel_error=_rel(actual, against),
        reference_rel_error=_rel(expected, golden) if golden is not None else math.nan,
        message="" if cmp else cmp.summary(),
    )


def _drill(model, args, kwargs, *, name: str, call: int, phase: str, ref: _SideRun, target_device, reference_device,
           golden: bool, tol, files, call_fn, sources: dict) -> OpDivergence:
    """Runs one module call alone on every side from the reference's inputs and compares its ops in order.

    ``sources`` maps (module, op) to the source line seen in the whole model's forward pass, which
    names the user's line even for a module (nn.GELU) whose own code lives in torch.
    """
    result = OpDivergence(module=name, call=call, phase=phase)
    path = "" if name == ROOT else name
    # The reference's inputs to that module call, from a fresh reference copy stopped at the call.
    m = copy.deepcopy(model).to(reference_device)
    recorder = _Recorder(m, capture=(name, call))
    try:
        (call_fn or _call_model)(m, _move(args, reference_device), _move(kwargs, reference_device))
    except _Captured:
        pass
    except Exception as exc:  # noqa: BLE001
        result.note = f"could not capture the inputs of {name}: {_one_line(exc)}"
        return result
    finally:
        recorder.remove()
    if recorder.captured is None:
        result.note = f"{name} was not called when the model ran again"
        return result
    sub_args, sub_kwargs = recorder.captured
    grad_out = None
    if phase == "backward":
        rec = next((c for c in ref.calls if c.name == name and c.call == call), None)
        grad_out = rec.grads if rec is not None else None

    def trace(device, double: bool):
        side = copy.deepcopy(model).to(device)
        if double:
            side = side.double()
        sub = side.get_submodule(path)
        a, k = _move(sub_args, device, double=double), _move(sub_kwargs, device, double=double)
        if phase == "backward":
            a = tree_map(lambda v: v.requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v, a)
        tracer = OpTracer(keep_outputs=True, source_files=files)
        recorder = _Recorder(sub, tracer=tracer, max_bytes=0, prefix=path)
        tracer.module_of = recorder.current
        with _default_dtype(torch.float64 if double else None):
            if phase == "forward":
                with tracer:
                    sub(*a, **k)
            else:
                with torch.autograd.set_detect_anomaly(True, check_nan=False):
                    out = sub(*a, **k)
                    # the recorded gradients are aligned with all tensor leaves of the module's output
                    pairs = [(o, _move(g, device, double=double).to(o.dtype)) for o, g in zip(_tensors(out), grad_out or [])
                             if g is not None and o.requires_grad and g.shape == o.shape]
                    with tracer:
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        recorder.remove()
        return tracer.values

    try:
        r_ops = trace(reference_device, False)
    except Exception as exc:  # noqa: BLE001
        result.note = f"{name} fails when run alone on the reference: {_one_line(exc)}"
        return result
    try:
        t_ops = trace(target_device, False)
    except Exception as exc:  # noqa: BLE001
        result.note = f"{name} fails when run alone on the target: {_one_line(exc)}"
        return result
    g_ops = None
    if golden:
        try:
            g_ops = trace("cpu", True)
        except Exception:  # noqa: BLE001 - no golden at op level then
            g_ops = None
    pairs = _pair([e.op for e in t_ops], [e.op for e in r_ops])
    gold_pairs = dict(_pair([e.op for e in r_ops], [e.op for e in g_ops])) if g_ops is not None else {}
    if len(pairs) < len(t_ops) or len(pairs) < len(r_ops):
        result.note = (f"the target ran {len(t_ops)} ops and the reference {len(r_ops)}; "
                       f"{len(pairs)} of them pair up and are compared")
    for ti, ri in pairs:
        t, r = t_ops[ti], r_ops[ri]
        gi = gold_pairs.get(ri)
        g = g_ops[gi] if gi is not None and g_ops is not None else None
        if not any(o is not None and (o.is_floating_point() or o.is_complex()) for o in r.outputs):
            continue
        gv = g.outputs if g is not None and len(g.outputs) == len(r.outputs) else None
        cmp = compare(t.outputs, r.outputs, golden=gv, tolerance=tol, path=t.op)
        worst, scale = _scale_error(t.outputs, gv if gv is not None else r.outputs)
        module = t.module or name
        source = t.source
        if source is None or source.file not in files:
            source = sources.get((module, t.op), source or r.source)
        result.ops.append(OpError(index=ti, op=t.op, module=module, source=source,
                                  ok=bool(cmp), max_abs=worst,
                                  scale_error=scale, message="" if cmp else cmp.summary()))
        if not cmp:
            break  # later ops inherit this op's error
    if result.first is None and not result.note:
        result.note = (f"no single op of {name} exceeds the tolerance with the reference's inputs: "
                       "the error builds up over its ops, or comes from the module's inputs")
    return result


def _pair(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Index pairs of equal op names in two sequences (difflib's matching blocks)."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        pairs.extend((block.a + k, block.b + k) for k in range(block.size))
    return pairs


__all__ = [
    "LayerError", "Localization", "OpDivergence", "OpError", "OpTracer", "ROOT", "ReferenceFailure", "SourceLine",
    "TargetFailure", "TraceEvent", "find_source", "localize",
]
