"""Shrinking a failing sample to a minimal reproducer, the way hypothesis shrinks a failing example.

A case that fails on a 2049 x 5 tensor, or on 40 samples of which three
fail, makes a poor bug report: 45 MB of inputs for one case was seen. So
the sample that failed with the fewest bytes of input is made smaller while
it keeps failing the same way, checked by running both sides and the judge
exactly as the case did. "The same way" is a :class:`FailureKind`: the same
status and, where the case's failures were named after a cause
(op_tests/causes.py), that cause still present, as hypothesis keeps a
failure's origin while it shrinks. A smaller input that fails otherwise (an
error where the case had a mismatch, or a mismatch whose rows no longer
cross the 128 tile) is another bug, and the shrinker does not slide into it.
Candidates it rejected are remembered by content, so none is run twice.
Candidates are cut as follows:

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

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from conformance.outcome import Status
from conformance.serialize import value_bytes

from .causes import cause_text
from .strategies.layouts import relayout
from .strategies.templates import keep_grad, make_sample
from .samples import sample_parts, sample_variant

BUDGET_S = 20.0
MAX_CHECKS = 200


@dataclass(frozen=True, slots=True)
class FailureKind:
    """How a sample fails: its status, and the cause its case was named after (a key of op_tests.causes.CAUSES)
    where the sample has that fact; None where the case names no cause, or the sample lacks it."""

    status: Status
    cause: str | None = None

    def __str__(self) -> str:
        return self.status.value + (f", {cause_text(self.cause)}" if self.cause else "")


@dataclass(slots=True, kw_only=True)
class Shrunk:
    sample: object
    before: list[tuple[int, ...]]
    after: list[tuple[int, ...]]
    failure: FailureKind | None = None
    checks: int = 0
    remembered: int = 0  # candidates met again after they were rejected, and not run again
    steps: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.before == self.after:
            return f"not smaller after {self.checks} checks"
        fmt = lambda shapes: ", ".join(" x ".join(map(str, s)) or "0-d" for s in shapes)  # noqa: E731
        kept = f", failing the same way ({self.failure})" if self.failure is not None else ""
        return f"shrunk from {fmt(self.before)} to {fmt(self.after)} in {self.checks} checks{kept}"


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


def shrink(sample, failure: FailureKind, fails_how: Callable[[object], FailureKind], *, budget_s: float = BUDGET_S,
           max_checks: int = MAX_CHECKS) -> Shrunk:
    """The smallest sample found that still fails as ``failure`` says the sample does; ``fails_how`` runs a
    candidate on both sides, judges it and says how it fails (a passing candidate: status pass)."""
    result = Shrunk(sample=sample, before=_shapes(sample), after=_shapes(sample), failure=failure)
    rejected: set[str] = set()
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
            key = _content_key(candidate)
            if key is not None and key in rejected:
                result.remembered += 1
                continue
            result.checks += 1
            try:
                same = fails_how(candidate) == failure
            except Exception:  # noqa: BLE001 - a candidate the harness cannot even run is no reproducer
                same = False
            if same:
                result.sample = candidate
                result.steps.append(step)
                improved = True
                break
            if key is not None:
                rejected.add(key)
    result.after = _shapes(result.sample)
    return result


def _content_key(sample) -> str | None:
    """What a candidate is: every leaf's shape, strides, dtype and values (two cuts that reach the same
    tensors from different samples are one candidate); None for a leaf whose bytes cannot be read (the
    candidate is then run, not remembered)."""
    try:
        return _hash_leaves(sample)
    except (RuntimeError, TypeError):
        return None


def _hash_leaves(sample) -> str:
    h = hashlib.sha1()
    leaves, spec = tree_flatten(sample_parts(sample))
    h.update(repr(spec).encode())
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.layout == torch.strided:
            t = leaf.detach()
            h.update(f"{t.dtype}{tuple(t.shape)}{t.stride()}{t.storage_offset() > 0}".encode())
            h.update(value_bytes(t))
        else:
            h.update(repr(leaf).encode())
    return h.hexdigest()


def _elements(sample) -> int:
    return sum(math.prod(t.shape) for t in _leaves(sample))
