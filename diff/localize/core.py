"""The entry point: run the model on every side with module recording, then compare layer by layer."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from conformance.host_copies import watch_host_copies

from ..draws import DrawLog, StartState, first_parting, same_draws
from ..judge import Judge, one_line
from ..precision import PrecisionModel, Runs, perturbed_runs
from ..sides import call_model, device_named_as, run_model
from ..tolerances import TolerancePolicy
from .drill import locate_op
from .recorder import DEFAULT_RECORD_BYTES, Call, Recorder
from .results import LayerError, Localization, ReferenceFailure, TargetFailure
from .source import SourceLine, exception_frames, find_source
from .tracer import OpTracer, cpu_copy, tensors

LossFn = Callable[[Any], torch.Tensor]
NOISE_RUNS = 2  # perturbed reference runs behind the layers' noise floor, for a target with a precision model


@dataclass(slots=True)
class SideRun:
    calls: list[Call]
    output: list[torch.Tensor] | None = None  # the output's tensors, copied to the CPU
    param_grads: dict[str, torch.Tensor] | None = None
    error: BaseException | None = None
    error_phase: str = "forward"
    error_module: str | None = None
    tracer: OpTracer | None = None
    truncated: bool = False
    draws: DrawLog | None = None


def run_side(model: torch.nn.Module, args, kwargs, *, device, double: bool, loss_fn, grad_output, trace: bool,
             source_files, max_bytes: int, call: Callable | None, rng_state: StartState,
             target_type: str | None = None) -> SideRun:
    """One side of the localisation: the model's forward with every module's output recorded (and every ATen
    op traced, on the target), then its backward from the loss or the given output gradient. Every side
    starts from the generators at ``rng_state`` and takes its random draws from the CPU's (diff.draws), so that a
    model that draws (dropout, ``randn_like``, ``random.randint``) computes the same thing on every side. Device arguments of
    ``target_type`` in the model's own code name this side's device (diff.sides.device_named_as)."""
    tracer = OpTracer(source_files=source_files) if trace else None
    recorders: list[Recorder] = []

    @contextmanager
    def instrument(m):
        recorder = Recorder(m, tracer=tracer, max_bytes=max_bytes)
        recorders.append(recorder)
        if tracer is not None:
            tracer.module_of = recorder.current
        try:
            # The model's own code only, not the copy made before it (a generator the model holds is copied
            # as it is: made for the CPU instead, its saved state would not fit it).
            with tracer if tracer is not None else nullcontext(), device_named_as(device, target_type):
                yield
        finally:
            recorder.remove()  # module hooks only: the gradient hooks on outputs stay for the backward pass

    with same_draws(rng_state, double=double, source_files=source_files) as drawn:
        run = run_model(
            model, device=device, dtype=torch.float64 if double else None, inputs=(tuple(args), dict(kwargs)),
            forward=lambda m, batch: (call or _call)(m, *batch),
            loss=(lambda out, batch: loss_fn(out)) if loss_fn is not None else None, grad_output=grad_output,
            instrument=instrument, keep_output=lambda out: [cpu_copy(t) for t in tensors(out)], capture_errors=True,
            loss_optional=True)
    recorder = recorders[0] if recorders else None
    side = SideRun(calls=recorder.calls if recorder else [], output=run.outputs, tracer=tracer,
                   truncated=bool(recorder and recorder.truncated), draws=drawn.log)
    if run.error is not None:
        side.error = run.error
        side.error_phase = "forward" if run.error_phase == "forward" else "backward"
        side.error_module = recorder.current() if recorder and side.error_phase == "forward" else None
        return side
    if run.grads is not None:
        side.param_grads = {n: cpu_copy(g) for n, g in run.grads.items() if g is not None}
    return side


def _call(model, args, kwargs):
    return call_model(model, (args, kwargs))


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
    precision: PrecisionModel | None = None,
) -> Localization:
    """Compares ``model(*args, **kwargs)`` module by module on the target against the reference.

    ``model`` is left untouched (every side runs a deep copy). The backward
    pass starts from ``loss_fn(output)`` (a scalar) or, where the loss is not
    known (an unchanged training script), from ``grad_output``, the gradient
    the script's own loss sent into the output: a list aligned with the
    output's floating-point tensors in pytree order, None where none flowed;
    with neither, only the forward pass is compared. ``tolerance`` is a dtype -> Tolerance function
    (default: the model-scope policy). ``source_files`` are the user's files,
    preferred when naming an op's source line. ``precision``: the target's
    precision model (diff.precision); when it names ops, the reference also
    runs NOISE_RUNS times perturbed by it, and every layer is judged against
    that noise floor too (a table-computed GELU is within device precision,
    not the first diverging layer). Raises ReferenceFailure when the model
    fails on the reference.
    """
    kwargs = dict(kwargs or {})
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    tol = tolerance or TolerancePolicy().for_dtype(type(model).__name__, scope="model")
    files = tuple(os.path.abspath(f) for f in source_files)
    # Every side starts from the same generator state and draws the reference's numbers (diff.draws).
    target_device = torch.device(target_device)
    common = dict(loss_fn=loss_fn, grad_output=grad_output, source_files=files, max_bytes=max_record_bytes, call=call,
                  rng_state=StartState.now(), target_type=target_device.type)
    return _localize(model, args, kwargs, target_device=target_device, reference_device=reference_device,
                     tol=tol, common=common, files=files, golden=golden, drill=drill, call=call,
                     precision=precision)


def _localize(model, args, kwargs, *, target_device, reference_device, tol, common, files, golden, drill,
              call, precision) -> Localization:
    result = Localization()
    ref = run_side(model, args, kwargs, device=reference_device, double=False, trace=False, **common)
    if ref.error is not None:
        source = find_source(exception_frames(ref.error), frozenset(files))
        where = f" in {ref.error_module}" if ref.error_module else ""
        raise ReferenceFailure(f"the model raised on the reference{where} ({ref.error_phase}): {one_line(ref.error)}",
                               module=ref.error_module, source=source)
    again = run_side(model, args, kwargs, device=reference_device, double=False, trace=False, **common)
    ref_out, again_out = ref.output or [], again.output or []
    result.reference_deterministic = _same(ref_out, again_out) and _same(
        list((ref.param_grads or {}).values()), list((again.param_grads or {}).values()))
    if not result.reference_deterministic:
        result.notes.append("two reference runs differ although every random draw was the same: the model is not "
                            "deterministic on the CPU; only the layers the reference reproduces are judged")

    gold = None
    if golden:
        gold = run_side(model, args, kwargs, device="cpu", double=True, trace=False, **common)
        if gold.error is not None:
            result.notes.append(f"no float64 golden: the model fails in float64 ({one_line(gold.error)})")
            gold = None
    result.golden = gold is not None

    with watch_host_copies(target_device.type != "cpu") as host:
        tgt = run_side(model, args, kwargs, device=target_device, double=False, trace=True, **common)
    result.trace = list(tgt.tracer.events) if tgt.tracer else []
    # An op handed CPU tensors is a placement problem (reported as such), not the backend computing on the host.
    given_cpu = {e.op for e in result.trace if e.cpu_inputs}
    # The draws taken on the CPU for the target (diff.draws) are the harness's copies, not the backend's.
    harness = given_cpu | (tgt.draws.redirected if tgt.draws else set())
    result.host_copies = {op: n for op, n in host.by_op.items() if op not in harness}
    parting = first_parting(ref.draws, tgt.draws) if ref.draws is not None and tgt.draws is not None else None
    if parting is not None and tgt.error is None:
        result.notes.append(f"the sides asked for different random numbers from {parting.describe()}: the model "
                            "takes another path on the target; layers after it compare different computations")
    result.draws = len(ref.draws or ())
    if tgt.truncated or ref.truncated:
        result.notes.append(f"module outputs beyond {common['max_bytes'] >> 20} MiB were not kept")
    if tgt.error is not None:
        failing = next((e for e in reversed(result.trace) if e.failed), None)
        result.target_failure = TargetFailure(
            message=one_line(tgt.error), phase=tgt.error_phase, module=tgt.error_module,
            op=failing.op if failing else None,
            source=(failing.source if failing and failing.source else find_source(exception_frames(tgt.error), frozenset(files))),
        )

    noisy = Runs()
    if precision:
        runs = perturbed_runs(lambda: run_side(model, args, kwargs, device=reference_device, double=False,
                                               trace=False, **common), precision, runs=NOISE_RUNS)
        noisy = Runs(r for r in runs if r.error is None and [(c.name, c.call) for c in r.calls] ==
                     [(c.name, c.call) for c in ref.calls])
        noisy.reasons = runs.reasons
    judge = Judge(tolerance=tol, precision=precision if noisy else None)
    compare_layers(result, ref, tgt, gold, judge, again=again, noisy=noisy)
    if tgt.error is None:
        result.outputs = judge(tgt.output or [], ref_out, golden=gold.output if gold else None,
                               noise=_noise(noisy, lambda r: r.output or [])).decided
        if ref.param_grads is not None and tgt.param_grads is not None:
            result.gradients = judge(tgt.param_grads, ref.param_grads,
                                     golden=gold.param_grads if gold and gold.param_grads else None,
                                     noise=_noise(noisy, lambda r: r.param_grads or {}), path="grad").decided
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
            result.ops = locate_op(model, args, kwargs, name=name, call=call_index, phase=phase, ref=ref,
                                   target_device=target_device, reference_device=reference_device, golden=golden,
                                   judge=judge, files=files, call_fn=call, sources=sources,
                                   rng_state=common["rng_state"])
    return result


def _noise(noisy: Runs, pick: Callable[[Any], Any]) -> Callable[[], Runs] | None:
    """The perturbed runs' values of one compared thing, for the judge's noise floor (None without runs)."""
    if not noisy:
        return None

    def runs() -> Runs:
        out = Runs(pick(r) for r in noisy)
        out.reasons = noisy.reasons
        return out

    return runs


def _same(a: Sequence, b: Sequence) -> bool:
    """Bit for bit (NaN equal to NaN): two reference runs of a deterministic model."""
    return len(a) == len(b) and all(_same_tensor(x, y) for x, y in zip(a, b))


def _same_tensor(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
    if x is None or y is None:
        return x is None and y is None
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_floating_point() or x.is_complex():
        return bool(((x == y) | (x.isnan() & y.isnan())).all())
    return torch.equal(x, y)


def compare_layers(result: Localization, ref: SideRun, tgt: SideRun, gold: SideRun | None, judge: Judge,
                   again: SideRun | None = None, noisy: Sequence[SideRun] = ()) -> None:
    """Judges every module call's output (forward) and the gradient into it (backward), in order.

    ``again`` is a second reference run: a value it does not reproduce bit for bit (a random op upstream)
    is marked ``random`` and not judged, so that only what the reference can vouch for decides.
    """
    n = min(len(ref.calls), len(tgt.calls))
    again_ok = again is not None and [(c.name, c.call) for c in again.calls] == [(c.name, c.call) for c in ref.calls]

    def random(i: int, phase: str) -> bool:
        if result.reference_deterministic:
            return False
        if not again_ok:
            return True
        r, a = ref.calls[i], again.calls[i]
        return not _same(*((r.outputs, a.outputs) if phase == "forward" else (r.grads, a.grads)))

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
        forward.append(layer_error(r, "forward", r.outputs, t.outputs, g.outputs if g else None, judge,
                                   random=random(i, "forward"), noisy=[n.calls[i].outputs for n in noisy]))
    backward: list[LayerError] = []
    have_grads = any(x is not None for c in ref.calls for x in c.grads)
    if have_grads and tgt.error is None:
        for i in reversed(range(n)):
            r, t = ref.calls[i], tgt.calls[i]
            if all(x is None for x in r.grads):
                continue
            g = gold.calls[i] if gold_ok else None
            backward.append(layer_error(r, "backward", r.grads, t.grads, g.grads if g else None, judge,
                                        random=random(i, "backward"), noisy=[n.calls[i].grads for n in noisy]))
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


def layer_error(r: Call, phase: str, rv, tv, gv, judge: Judge, *, random: bool = False,
                noisy: Sequence[Sequence] = ()) -> LayerError:
    kept = [j for j, (a, b) in enumerate(zip(tv, rv)) if a is not None and b is not None]
    pairs = [(tv[j], rv[j], (gv[j] if gv is not None and j < len(gv) else None)) for j in kept]
    noise = None
    if noisy and all(len(n) == len(rv) and all(n[j] is not None for j in kept) for n in noisy):
        def noise():
            return [[n[j] for j in kept] for n in noisy]
    if not pairs:
        return LayerError(module=r.name, type=r.type, call=r.call, phase=phase, ok=True, max_abs=0.0,
                          rel_error=0.0, reference_rel_error=math.nan)
    actual = [a for a, _, _ in pairs]
    expected = [b for _, b, _ in pairs]
    golden = [c for _, _, c in pairs] if gv is not None and all(c is not None for _, _, c in pairs) else None
    verdict = judge(actual, expected, golden=golden, path=r.name, noise=noise)
    against = golden if golden is not None else expected
    return LayerError(
        module=r.name, type=r.type, call=r.call, phase=phase, ok=random or bool(verdict), random=random,
        max_abs=verdict.comparison.worst.get("max_abs", 0.0),
        rel_error=relative_error(actual, against),
        reference_rel_error=relative_error(expected, golden) if golden is not None else math.nan,
        message="not judged: the reference does not reproduce itself here" if random else
        ("" if verdict else verdict.message),
    )


def relative_error(values: Sequence[torch.Tensor | None], against: Sequence[torch.Tensor | None]) -> float:
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
