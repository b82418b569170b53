"""Drilling into the first diverging module: its ATen ops, run alone on every side from the reference's inputs.

With identical inputs, the first op whose output fails the judge is the op
that went wrong, not one that inherited an upstream error. Op sequences are
paired with difflib, so a backend that picks another kernel sequence (an SDPA
variant, say) is still compared op by op where the sequences agree. A module
that computes correctly from the reference's inputs received wrong inputs:
the error entered in its parent's own code, so the parent is drilled next.
"""

from __future__ import annotations

import difflib
import math

import torch
from torch.utils._pytree import tree_map

from ..draws import same_draws
from ..judge import one_line
from ..sides import default_dtype, device_named_as, side_model, to_device
from .recorder import Captured, Recorder
from .results import ROOT, OpDivergence, OpError
from .tracer import OpTracer, tensors


def locate_op(model, args, kwargs, *, name: str, call: int, ref, **options) -> OpDivergence:
    """Drills into the module call, then into its enclosing calls, until one of them holds a diverging op.

    A module that computes correctly from the reference's inputs received wrong inputs: the error entered
    in its parent's own code (a functional op between two submodules), so the parent is drilled next.
    """
    parents = {(c.name, c.call): c.parent for c in ref.calls}
    tried: list[str] = []
    current: tuple[str, int] | None = (name, call)
    result = None
    while current is not None:
        result = drill(model, args, kwargs, name=current[0], call=current[1], ref=ref, **options)
        if result.unnamed:
            return result
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




def drill(model, args, kwargs, *, name: str, call: int, phase: str, ref, target_device, reference_device,
           golden: bool, judge, files, call_fn, sources: dict, rng_state) -> OpDivergence:
    """Runs one module call alone on every side from the reference's inputs and compares its ops in order.

    ``sources`` maps (module, op) to the source line seen in the whole model's forward pass, which
    names the user's line even for a module (nn.GELU) whose own code lives in torch.
    """
    result = OpDivergence(module=name, call=call, phase=phase)
    path = "" if name == ROOT else name
    # The reference's inputs to that module call, from a fresh reference copy stopped at the call.
    m = side_model(model, reference_device)
    recorder = Recorder(m, capture=(name, call))
    try:
        args_, kwargs_ = to_device((args, kwargs), reference_device, requires_grad=False)
        with same_draws(rng_state, source_files=files), \
                device_named_as(reference_device, torch.device(target_device).type):
            (call_fn or _call_model)(m, args_, kwargs_)  # the whole run's reference draws, up to that call
    except Captured:
        pass
    except Exception as exc:  # noqa: BLE001
        result.note = f"could not capture the inputs of {name}: {one_line(exc)}"
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
        dtype = torch.float64 if double else None
        side = side_model(model, device, dtype)
        sub = side.get_submodule(path)
        a, k = to_device((sub_args, sub_kwargs), device, dtype, requires_grad=False)
        if phase == "backward":
            a = tree_map(lambda v: v.requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v, a)
        tracer = OpTracer(keep_outputs=True, source_files=files)
        recorder = Recorder(sub, tracer=tracer, max_bytes=0, prefix=path)
        tracer.module_of = recorder.current
        with same_draws(rng_state, double=double, source_files=files), default_dtype(dtype), \
                device_named_as(device, torch.device(target_device).type):
            if phase == "forward":
                with tracer:
                    sub(*a, **k)
            else:
                with torch.autograd.set_detect_anomaly(True, check_nan=False):
                    out = sub(*a, **k)
                    # the recorded gradients are aligned with all tensor leaves of the module's output
                    pairs = [(o, to_device(g, device, dtype).to(o.dtype)) for o, g in zip(tensors(out), grad_out or [])
                             if g is not None and o.requires_grad and g.shape == o.shape]
                    with tracer:
                        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        recorder.remove()
        return tracer.values

    try:
        r_ops = trace(reference_device, False)
    except Exception as exc:  # noqa: BLE001
        result.note = f"{name} fails when run alone on the reference: {one_line(exc)}"
        return result
    try:
        t_ops = trace(target_device, False)
    except Exception as exc:  # noqa: BLE001
        result.note = f"{name} fails when run alone on the target: {one_line(exc)}"
        return result
    g_ops = None
    if golden:
        try:
            g_ops = trace("cpu", True)
        except Exception:  # noqa: BLE001 - no golden at op level then
            g_ops = None
    pairs = pair([e.op for e in t_ops], [e.op for e in r_ops])
    gold_pairs = dict(pair([e.op for e in r_ops], [e.op for e in g_ops])) if g_ops is not None else {}
    if len(pairs) < len(t_ops) or len(pairs) < len(r_ops):
        result.note = (f"the target ran {len(t_ops)} ops and the reference {len(r_ops)}; "
                       f"{len(pairs)} of them pair up and are compared")
    paired, r_names = {ti for ti, _ in pairs}, {e.op for e in r_ops}
    for ti, ri in pairs:
        t, r = t_ops[ti], r_ops[ri]
        gi = gold_pairs.get(ri)
        g = g_ops[gi] if gi is not None and g_ops is not None else None
        if not any(o is not None and (o.is_floating_point() or o.is_complex()) for o in r.outputs):
            continue
        if [getattr(o, "shape", None) for o in t.outputs] != [getattr(o, "shape", None) for o in r.outputs]:
            continue  # paired by name only (the sides run other kernels around it): not the same computation
        # Kernels before this op that the reference never runs (a device's fused LSTM cells, where the CPU runs
        # oneDNN's whole layer): the error may enter in them, which no pair can show.
        unpaired = list(dict.fromkeys(t_ops[k].op for k in range(ti) if k not in paired and t_ops[k].op not in r_names))
        gv = g.outputs if g is not None and len(g.outputs) == len(r.outputs) else None
        cmp = judge(t.outputs, r.outputs, golden=gv, path=t.op)
        worst, scale = scale_error(t.outputs, gv if gv is not None else r.outputs)
        module = t.module or name
        source = t.source
        if source is None or source.file not in files:
            source = sources.get((module, t.op), source or r.source)
        if not cmp and unpaired and moves_values(t.op):
            others = sorted(r_names - {e.op for e in t_ops})
            result.note = (f"{t.op} is the first op that differs, after kernels the reference does not run "
                           f"({', '.join(unpaired)}{'; it runs ' + ', '.join(others) if others else ''}): the error "
                           f"enters in one of them or in {t.op}")
            result.unnamed = True
            break
        result.ops.append(OpError(index=ti, op=t.op, module=module, source=source,
                                  ok=bool(cmp), max_abs=worst,
                                  scale_error=scale, message="" if cmp else cmp.message))
        if not cmp:
            break  # later ops inherit this op's error
    if result.first is None and not result.note:
        result.note = (f"no single op of {name} exceeds the tolerance with the reference's inputs: "
                       "the error builds up over its ops, or comes from the module's inputs")
    return result


# Ops that copy or regroup values without computing on them (views are found from their schemas).
_COPIES = frozenset({"aten::stack", "aten::cat", "aten::clone", "aten::contiguous", "aten::_to_copy", "aten::copy_",
                     "aten::index_select", "aten::gather", "aten::flip", "aten::roll", "aten::repeat",
                     "aten::constant_pad_nd"})


def moves_values(op: str) -> bool:
    """Whether an ATen op only moves, copies or views values: no numerical error can enter there, so where
    it is the first op to differ after kernels the reference does not run, the error entered in those."""
    if op in _COPIES:
        return True
    try:
        schemas = torch._C._jit_get_schemas_for_operator(op)
    except RuntimeError:
        return False
    tensor_schemas = [s for s in schemas if s.returns and all("Tensor" in str(r.type) for r in s.returns)]
    return bool(tensor_schemas) and all(r.alias_info is not None and not r.alias_info.is_write
                                        for s in tensor_schemas for r in s.returns)


def _call_model(model, args, kwargs):
    return model(*args, **kwargs)


def scale_error(values, against) -> tuple[float, float]:
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


def pair(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Index pairs of equal op names in two sequences (difflib's matching blocks)."""
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        pairs.extend((block.a + k, block.b + k) for k in range(block.size))
    return pairs


__all__ = ["drill", "locate_op", "moves_values", "pair", "scale_error"]
