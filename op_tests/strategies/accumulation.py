"""The ``accumulation`` input strategy: long float16 and bfloat16 rows for ops that accumulate along them.

A kernel that adds float16 or bfloat16 values in their own precision loses
them once the running sum is large: a mean of 65,536 float16 elements
accumulated in float16 is percent-wrong, while on OpInfo's rows of 5 to 20
elements it is right to the last bit. The CPU (and Trainium's PSUM)
accumulates in float32, so the float64 golden tells the two apart. The
``sizes`` strategy makes its long rows in float32 and int64 only; this one
makes them in the reduced-precision dtypes the op supports, at lengths
across the tile boundaries up to 65,536.

Which dimensions accumulate is measured, not listed: on a float32 copy of
the op's own template, the first and the last element along a dimension are
each perturbed; where both perturbations reach one output element, that
element sums over the dimension (reductions, cumulative ops, norms, softmax,
layer and group norm, the K dimension of mm, bmm, addmm and matmul).
Element-wise ops and the M and N dimensions of a matmul never pass that
test, and get no case.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils._pytree import tree_leaves

from ..rules import rule_for
from .sizes import MAX_NUMEL_LONG, affordable, coupling_of, resized
from .templates import has_empty, make_sample, map_tensors, parts_of, primary, templates, tensor_leaves

DTYPES = ("float16", "bfloat16")
LENGTHS = (128, 129, 2048, 2049, 65536)  # a tile, one past it, a long tile, one past it, the longest row
PROBE_TEMPLATES = 4
MAX_OPERANDS = 3  # floating tensors probed per template (input, mat1, mat2)
MIN_LENGTH = 2  # a dimension of one element has no first and last to perturb


def _outputs(op, parts) -> list[torch.Tensor] | None:
    try:
        with torch.no_grad():
            out = op(parts[0], *parts[1], **parts[2])
    except Exception:  # noqa: BLE001 - an op refusing the perturbed values tells nothing
        return None
    return [t.detach().reshape(-1) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


def _changed(base: list[torch.Tensor], other: list[torch.Tensor]) -> torch.Tensor | None:
    if len(base) != len(other) or any(a.shape != b.shape for a, b in zip(base, other)):
        return None
    if not base:
        return None
    masks = [~((a == b) | (a.isnan() & b.isnan())) if a.is_floating_point() or a.is_complex() else a != b
             for a, b in zip(base, other)]
    return torch.cat(masks)


def _perturbed(parts, leaf: int, dim: int, index: int):
    """``parts`` with tensor leaf ``leaf``'s slice ``index`` on ``dim`` moved by a quarter of its size plus one."""

    def move(k, t):
        if k != leaf:
            return t.detach()
        out = t.detach().clone()
        piece = out.select(dim, index)
        piece.add_(0.25 * (piece.abs() + 1))
        return out

    return map_tensors(parts, move)


def accumulating_dims(op, parts) -> list[tuple[int, int]]:
    """(tensor leaf, dimension) pairs along which some output element depends on both the first and the last
    element: the dimensions the op sums (or otherwise folds) over, of its input and of its other floating
    operands (the K dimension of ``addmm``'s ``mat1``). ``parts`` are float32 or float64."""
    if has_empty(parts):
        return []
    base = _outputs(op, parts)
    again = _outputs(op, parts)
    repeat = _changed(base, again) if base and again is not None else None
    if repeat is None or bool(repeat.any()):  # no tensor output, or one that differs run to run (empty_like)
        return []
    floating = [(k, t) for k, t in enumerate(tensor_leaves(parts)) if t.is_floating_point() and t.dim()]
    found = []
    for leaf, t in floating[:MAX_OPERANDS]:
        for dim in range(t.dim()):
            if t.shape[dim] < MIN_LENGTH:
                continue
            first = _outputs(op, _perturbed(parts, leaf, dim, 0))
            last = _outputs(op, _perturbed(parts, leaf, dim, -1))
            a = _changed(base, first) if first is not None else None
            b = _changed(base, last) if last is not None else None
            if a is not None and b is not None and bool((a & b).any()):
                found.append((leaf, dim))
    return found


def _probeable(sample) -> bool:
    """A template with a dimension of two or more elements (reductions' first samples are 0-d) and no empty
    one."""
    x = primary(parts_of(sample))
    return x is not None and any(n >= MIN_LENGTH for n in x.shape) and not has_empty(parts_of(sample))


_ACCUMULATES: dict[str, bool] = {}  # per op key: enumeration asks once per process


def _accumulates(op_key: str, op) -> bool:
    if op_key in _ACCUMULATES:
        return _ACCUMULATES[op_key]
    probe = SimpleNamespace(seed=0, dtype="float32")  # what templates() reads of a case
    found = templates(op, probe, requires_grad=False, limit=PROBE_TEMPLATES, keep=_probeable)
    _ACCUMULATES[op_key] = any(accumulating_dims(op, parts_of(t)) for t in found)
    return _ACCUMULATES[op_key]


def accumulation_dtypes(op, supported: tuple[str, ...], direction: str) -> tuple[str, ...]:
    """float16 and bfloat16 (those the op supports), forward, for ops that accumulate along some dimension
    of their float32 samples."""
    chosen = tuple(d for d in DTYPES if d in supported)
    if direction != "forward" or not chosen or "float32" not in supported:
        return ()
    key = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
    if rule_for(key).compare != "values":  # random draws and uninitialised memory have no sums to check
        return ()
    try:
        return chosen if _accumulates(key, op) else ()
    except Exception:  # noqa: BLE001 - sample functions that fail on the CPU give the strategy nothing
        return ()


def make_samples(op, case) -> list:
    """Each accumulating dimension of up to four templates stretched to every length of ``LENGTHS`` in the
    case's dtype (the template's own values, gathered), within the sizes strategy's budget."""
    dtype = getattr(torch, case.dtype)
    found = templates(op, case, requires_grad=False, limit=PROBE_TEMPLATES, keep=_probeable)
    samples = []
    for k, template in enumerate(found):
        parts = parts_of(template)
        wide = map_tensors(parts, lambda _, t: t.detach().float() if t.dtype == dtype else t.detach())
        for leaf, dim in accumulating_dims(op, wide):
            coupling = coupling_of(op, parts, dim, case.seed, leaf)
            if coupling is None:
                continue
            rank = tensor_leaves(parts)[leaf].dim()
            where = f"dim {dim - rank}" + (f" of operand {leaf}" if leaf else "")
            for length in LENGTHS:
                candidate = resized(parts, dim, length, coupling, case.seed, leaf, limit=MAX_NUMEL_LONG)
                if candidate is None or not affordable(op, candidate, length):
                    continue
                samples.append(make_sample(candidate, f"{case.dtype} row of {length} on {where} "
                                                      f"(sample {k}, {coupling})", like=template))
    return samples
