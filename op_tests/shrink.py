"""Shrinking a failing sample to a minimal reproducer, the way hypothesis shrinks a failing example.

A case that fails on a 2049 x 5 tensor, or on 40 samples of which three
fail, makes a poor bug report: 45 MB of inputs for one case was seen. So
the sample that failed with the fewest bytes of input is made smaller while
it keeps failing the same way (same status, checked by running both sides
and the judge, exactly as the case did):

- dimensions are cut, all tensors' dimensions of one length together first
  (a matmul's contracted dimension, a broadcast pair), then one at a time;
- a cut keeps the first or the last part of the dimension, so the failing
  region survives (a tile boundary at 128 shrinks 2049 -> 1025 -> ... -> 129);
- each cut tensor is stored in its original layout again (transposed,
  strided, expanded, channels-last or at an offset: layouts.relayout), so a
  stride bug stays a stride bug.

Shrinking stops when no cut fails any more, or at a time and check budget,
and says what it did ("2049 x 5 -> 129 x 1 in 23 checks").
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .families.layouts import relayout
from .families.templates import keep_grad, make_sample
from .samples import sample_parts, sample_variant

BUDGET_S = 20.0
MAX_CHECKS = 200


@dataclass(slots=True, kw_only=True)
class Shrunk:
    sample: object
    before: list[tuple[int, ...]]
    after: list[tuple[int, ...]]
    checks: int = 0
    steps: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.before == self.after:
            return f"not smaller after {self.checks} checks"
        fmt = lambda shapes: ", ".join(" x ".join(map(str, s)) or "0-d" for s in shapes)  # noqa: E731
        return f"shrunk from {fmt(self.before)} to {fmt(self.after)} in {self.checks} checks"


def input_bytes(sample) -> int:
    return sum(t.numel() * t.element_size() for t in _leaves(sample))


def _leaves(sample) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(sample_parts(sample))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.layout == torch.strided]


def _shapes(sample) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in _leaves(sample)]


def _with_parts(sample, parts):
    return make_sample(parts, sample.name or "", sample_variant(sample), like=sample)


def _cut(sample, where: list[tuple[int, int]], start: int, length: int):
    """The sample with each (tensor leaf, dimension) in ``where`` narrowed to [start, start + length)."""
    leaves, spec = tree_flatten(sample_parts(sample))
    tensor_positions = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.layout == torch.strided]
    cuts: dict[int, list[int]] = {}
    for leaf, dim in where:
        cuts.setdefault(tensor_positions[leaf], []).append(dim)
    out = list(leaves)
    for position, dims in cuts.items():
        t = leaves[position]
        values = t.detach()
        for dim in dims:
            values = values.narrow(dim, start, length)
        out[position] = keep_grad(relayout(values.clone(), like=t), t)
    return _with_parts(sample, tree_unflatten(out, spec))


def _lengths(size: int) -> list[int]:
    """Shorter lengths to try, boldest first: 1, half, then ever closer to ``size``."""
    out, step = [1], size // 2
    while step >= 1:
        out.append(size - step)
        step //= 2
    return [n for n in dict.fromkeys(out) if 1 <= n < size]


def _candidates(sample) -> Iterator[tuple[object, str]]:
    leaves = _leaves(sample)
    by_length: dict[int, list[tuple[int, int]]] = {}
    for i, t in enumerate(leaves):
        for d, size in enumerate(t.shape):
            if size > 1:
                by_length.setdefault(size, []).append((i, d))
    groups = [(size, where) for size, where in sorted(by_length.items(), key=lambda kv: -kv[0])]
    singles = [(size, [w]) for size, where in groups if len(where) > 1 for w in where]
    for size, where in groups + singles:
        for n in _lengths(size):
            for start, side in ((0, "first"), (size - n, "last")):
                try:
                    yield _cut(sample, where, start, n), f"length {size} -> {n} ({side} part)"
                except (RuntimeError, IndexError, ValueError):
                    continue


def shrink(sample, still_fails: Callable[[object], bool], *, budget_s: float = BUDGET_S,
           max_checks: int = MAX_CHECKS) -> Shrunk:
    """The smallest sample found that still fails; ``still_fails`` runs a candidate on both sides and judges it."""
    result = Shrunk(sample=sample, before=_shapes(sample), after=_shapes(sample))
    deadline = time.monotonic() + budget_s
    improved = True
    while improved:
        improved = False
        for candidate, step in _candidates(result.sample):
            if result.checks >= max_checks or time.monotonic() > deadline:
                result.after = _shapes(result.sample)
                return result
            if _elements(candidate) >= _elements(result.sample):
                continue
            result.checks += 1
            try:
                fails = still_fails(candidate)
            except Exception:  # noqa: BLE001 - a candidate the harness cannot even run is no reproducer
                fails = False
            if fails:
                result.sample = candidate
                result.steps.append(step)
                improved = True
                break
    result.after = _shapes(result.sample)
    return result


def _elements(sample) -> int:
    return sum(math.prod(t.shape) for t in _leaves(sample))
