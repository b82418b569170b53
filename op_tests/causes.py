"""What the failing samples of an op case have in common: the cause a failure group is named after.

A stride bug in ``exp`` fails every dtype and direction, in OpInfo's samples,
the hypothesis examples and the layouts strategy alike; one report line per
case would bury it. So each sample gets plain facts about its inputs
(non-contiguous, a dimension longer than 128, values beyond int32, mixed
dtypes, an in-place call, duplicate or negative indices, ...), and a failing
case's cause is the fact that separates the failing samples from the passing
ones: every failing sample has it, and the fewest passing samples do (at most
half of them; a fact most passing samples share too names no cause, however
common it is among the failures). "non-contiguous inputs", "rows longer than
128", "duplicate indices". Facts are read from the inputs themselves,
never from knowing a fault, and are coarse on purpose, so that one root
cause gets the same name in every case it breaks (results/groups.py groups
by op, status and cause).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from .samples import sample_parts, sample_variant

TILE = 128
LONG = 65536


def _tensors(parts) -> list[torch.Tensor]:
    return [t for t in tree_leaves(parts) if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def _values(t: torch.Tensor) -> torch.Tensor:
    return t.detach().resolve_conj().resolve_neg()


_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def _float_values(ts) -> list[tuple[torch.Tensor, torch.dtype]]:
    """Each floating tensor's values in float64 (complex: real and imaginary parts), with its real dtype."""
    out = []
    for t in ts:
        if t.numel() and (t.is_floating_point() or t.is_complex()):
            v = _values(t)
            v = torch.view_as_real(v.to(torch.complex128)) if v.is_complex() else v.to(torch.float64)
            out.append((v.reshape(-1), _REAL.get(t.dtype, t.dtype)))
    return out


def _int_values(ts) -> list[tuple[torch.Tensor, torch.dtype]]:
    return [(_values(t).reshape(-1), t.dtype) for t in ts
            if t.numel() and not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool]


def _dim_argument(sample) -> int | None:
    """The ``dim`` the op reduces or normalises over, as the sample passes it."""
    dim = sample.kwargs.get("dim")
    if dim is None and sample.args and isinstance(sample.args[0], int):
        dim = sample.args[0]
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


# Index ops: op name -> (position in args of the index tensor, or of index_put's list of them; what they index:
# the position in args of the dimension argument, FLAT for the flattened input, ROWS for the input's first dimension,
# LEADING for index_put's one dimension per index tensor). Index facts are read only where an argument is an index.
FLAT, ROWS, LEADING = "flat", "rows", "leading"
INDEX_ARGUMENTS: dict[str, tuple[int, int | str]] = {
    **{name: (1, 0) for name in ("index_add", "index_copy", "index_fill", "index_select", "index_reduce", "scatter",
                                 "scatter_add", "scatter_reduce", "gather")},
    "take_along_dim": (0, 1),
    "take": (0, FLAT),
    "put": (0, FLAT),
    "index_put": (0, LEADING),
    "nn.functional.embedding": (0, ROWS),  # OpInfo calls it with the weight first
}


def _indices(op: str, sample) -> tuple[list[tuple[torch.Tensor, int]], torch.Tensor | None]:
    """An index op's integer index tensors, each with the length of the dimension it indexes, and the places
    they select, one row each (repeated rows: duplicate indices). A scatter's or gather's index selects places
    within each line along its dim; index_put's index tensors select one place together."""
    if op not in INDEX_ARGUMENTS or not isinstance(sample.input, torch.Tensor):
        return [], None
    position, target = INDEX_ARGUMENTS[op]
    x, args = sample.input, sample.args
    found = args[position] if position < len(args) else None
    found = list(found) if target == LEADING and isinstance(found, (list, tuple)) else [found]
    ints = [t for t in found if isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex()
            and t.dtype != torch.bool and t.numel()]
    if not ints or len(ints) > max(x.dim(), 1):
        return [], None
    if target == LEADING:
        shape = torch.broadcast_shapes(*(t.shape for t in ints))
        places = torch.stack([t.expand(shape).reshape(-1) for t in ints], -1)
        return [(t, x.shape[k] if x.dim() else 1) for k, t in enumerate(ints)], places
    (index,) = ints
    dim = target if target in (FLAT, ROWS) else args[target] if target < len(args) else sample.kwargs.get("dim")
    if isinstance(dim, int) and not all(-max(t.dim(), 1) <= dim < max(t.dim(), 1) for t in (x, index)):
        return [], None  # a sample the op refuses
    if dim == ROWS or isinstance(dim, int):
        size = x.shape[0 if dim == ROWS else dim] if x.dim() else 1
    else:
        size = x.numel()
    places = index.reshape(-1, 1)
    if isinstance(dim, int) and index.dim() > 1:  # lines along dim, each selecting its places
        lines = index.movedim(dim, -1).reshape(-1, index.shape[dim])
        line = torch.arange(lines.shape[0]).unsqueeze(-1).expand(lines.shape)
        places = torch.stack([line.reshape(-1), lines.reshape(-1)], -1)
    return [(index, size)], places


def _index_facts(op: str, sample) -> set[str]:
    facts = set()
    indexed, places = _indices(op, sample)
    for index, size in indexed:
        if bool((index < 0).any()):
            facts.add("negative_indices")
        if size > 1 and bool(((index == size - 1) | (index == -size)).any()):
            facts.add("boundary_indices")
    if places is not None and places.unique(dim=0).shape[0] < places.shape[0]:
        facts.add("duplicate_indices")
    return facts


def sample_facts(sample, strategy: str = "", op: str = "") -> frozenset[str]:
    """The facts (keys of CAUSES) that hold for one sample's inputs; ``op``: the op's name, for the facts
    about its index arguments."""
    parts = sample_parts(sample)
    ts = _tensors(parts)
    facts: set[str] = _index_facts(op, sample)
    variant = sample_variant(sample)
    if variant:
        facts.add(f"variant:{variant}")
    if strategy == "mixed":
        facts.add("mixed_dtypes")
        operands = sorted({str(t.dtype).removeprefix("torch.") for t in ts})
        scalars = sorted({type(v).__name__ for v in tree_leaves(parts) if isinstance(v, (bool, int, float, complex))})
        facts.add("dtypes:" + ",".join(operands + [f"Python {s}" for s in scalars]))
        if "Python" in (sample.name or ""):
            facts.add("python_scalar")
    if any(not t.is_contiguous() and t.numel() > 1 for t in ts):
        facts.add("noncontiguous")
    if any(t.storage_offset() > 0 for t in ts):
        facts.add("storage_offset")
    if any(0 in t.shape for t in ts):
        facts.add("empty")
    if any(max(t.shape, default=0) >= LONG for t in ts):
        facts.add("long")
    dim = _dim_argument(sample)
    x = next(iter(ts), None)
    if dim is not None and x is not None and -x.dim() <= dim < x.dim() and x.shape[dim] > TILE:
        facts.add("dim_over_tile")
    if any(t.dim() and t.shape[-1] > TILE for t in ts):
        facts.add("rows_over_tile")
    if any(t.dim() > 1 and t.shape[0] > TILE for t in ts):
        facts.add("leading_over_tile")
    for v, dtype in _float_values(ts):
        info = torch.finfo(dtype)
        finite = v[torch.isfinite(v)]
        if finite.numel() < v.numel():
            facts.add("nonfinite")
        if finite.numel():
            size = finite.abs()
            if bool((size > 2.0**24).any()):
                facts.add("above_2_24")
            if bool((size >= info.max / 4).any()):
                facts.add("large_values")
            if bool(((size > 0) & (size < info.smallest_normal)).any()) or bool(
                    ((finite == 0) & torch.signbit(finite)).any()):
                facts.add("tiny_values")
    for v, dtype in _int_values(ts):
        info = torch.iinfo(dtype)
        if bool(((v == info.min) | (v == info.max)).any()):
            facts.add("int_limits")
        wide = v.to(torch.int64) if dtype != torch.uint64 else v.view(torch.int64)
        if bool(((wide > 2**31 - 1) | (wide < -(2**31))).any()):
            facts.add("beyond_int32")
        if bool((wide.abs() > 2**24).any()):
            facts.add("above_2_24")
    return frozenset(facts)


# key -> what the failing samples have in common, as a report says it; most specific first (ties break here)
CAUSES: dict[str, str] = {
    "variant:inplace": "the in-place variant",
    "variant:out": "out= with a preallocated output",
    "variant:out_resize": "out= with an output to resize",
    "variant:view": "views (writes through the output must reach the input)",
    "python_scalar": "Python scalar operands",
    "mixed_dtypes": "operands of mixed dtypes",
    "duplicate_indices": "duplicate indices",
    "negative_indices": "negative indices",
    "boundary_indices": "indices at the boundary (the last position, or -size)",
    "long": "reductions of 65,536 elements or more",
    "dim_over_tile": "the reduced dimension longer than 128",
    "rows_over_tile": "rows longer than 128",
    "leading_over_tile": "a leading dimension longer than 128",
    "beyond_int32": "integers beyond the int32 range",
    "int_limits": "integer minimum and maximum values",
    "above_2_24": "values above 2^24",
    "nonfinite": "infinities and NaN",
    "tiny_values": "denormal values and -0.0",
    "large_values": "very large values",
    "noncontiguous": "non-contiguous inputs",
    "storage_offset": "inputs at a storage offset",
    "empty": "empty tensors",
}
ALL_INPUTS = ("all", "every input")
SOME_INPUTS = ("some", "some inputs")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    key: str
    text: str
    failing: int  # samples that failed
    passing_alike: int  # passing samples that share the fact (0: it separates them exactly; at most half of them)

    def to_dict(self) -> dict:
        return {"key": self.key, "text": self.text, "failing": self.failing, "passing_alike": self.passing_alike}


def case_cause(facts: list[frozenset[str]], failed: list[bool]) -> Cause | None:
    """The fact that separates the failing samples from the passing ones: every failing sample has it, and the
    fewest passing ones have it, at most half of them (a fact most passing samples share separates nothing, and
    naming it would blame, say, strides for a bug in duplicate indices). None when nothing failed."""
    failing = [f for f, bad in zip(facts, failed) if bad]
    passing = [f for f, bad in zip(facts, failed) if not bad]
    if not failing:
        return None
    if not passing:
        return Cause(key=ALL_INPUTS[0], text=ALL_INPUTS[1], failing=len(failing), passing_alike=0)
    shared = set.intersection(*(set(f) for f in failing))
    best = None
    dynamic = sorted(k for k in shared if k.startswith("dtypes:"))
    for rank, key in enumerate([*dynamic, *CAUSES]):
        if key not in shared:
            continue
        alike = sum(key in f for f in passing)
        if 2 * alike > len(passing):  # most passing samples have it too: it does not separate
            continue
        score = (alike, rank)
        if best is None or score < best[0]:
            best = (score, key, alike)
    if best is None:
        return Cause(key=SOME_INPUTS[0], text=SOME_INPUTS[1], failing=len(failing), passing_alike=len(passing))
    _, key, alike = best
    return Cause(key=key, text=cause_text(key), failing=len(failing), passing_alike=alike)


def cause_text(key: str) -> str:
    if key.startswith("dtypes:"):
        return "operands of dtypes " + " and ".join(key.removeprefix("dtypes:").split(","))
    return CAUSES.get(key) or dict((ALL_INPUTS, SOME_INPUTS)).get(key, key)
