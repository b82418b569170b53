"""Input strategies that hunt accelerator bugs, on top of OpInfo's samples.

OpInfo's samples are small, same-dtype, contiguous and moderate-valued; the
bugs accelerators ship hide exactly where they are not. Each strategy derives
new samples from an op's own OpInfo samples (its *templates*), so it applies
to every op whose samples it can transform, not only to element-wise ones:

- ``sizes``: lengths across hardware tile boundaries (1, 127, 128, 129, ...,
  2049) and long reductions (65,536 elements) on the leading, last and
  ``dim`` dimensions (sizes.py);
- ``extremes``: integer limits, values beyond 2^24 and 2^31, the largest
  finite value, denormals, infinities, NaN and -0.0 (extremes.py);
- ``mixed``: operands of other dtypes, 0-d tensors and Python scalars, whose
  result dtype must follow ``torch.result_type`` (mixed.py);
- ``layouts``: the same values transposed, sliced with a step, expanded,
  channels-last, and at a storage offset (layouts.py);
- ``variants``: in-place and ``out=`` against the functional result, and
  views that must alias their base (variants.py);
- ``ties``: tied values for ops that return indices of tied elements, whose
  documented contract (the first occurrence, or any) decides how they are
  compared (ties.py);
- ``accumulation``: float16 and bfloat16 rows of 128 to 65,536 elements along
  the dimensions an op sums over, found by perturbing a row's first and last
  element (accumulation.py).

(The hypothesis examples for element-wise ops, shapes, layouts and special
values drawn by hypothesis's own strategies, are in hypothesis_examples.py;
their cases have their own source, ``{"source": "hypothesis"}``.)

A strategy case is one op x dtype x direction x strategy, with config
``{"source": "family", "inputs": STRATEGY}`` (``"family"``: the name these
strategies had when the first case ids were pinned; ids hash the config, so it
stays): a stable id, and a fixed seed
(the case's) for everything random in it. Each sample is named after what
makes it special ("length 129 on dim -1", "transposed input"), and that name
reaches messages, reproducers and failure groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

STRATEGIES = ("sizes", "extremes", "mixed", "layouts", "variants", "ties", "accumulation")


class StrategyNotApplicable(ValueError):
    """The op's samples give this strategy nothing to transform."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    name: str
    description: str
    # dtype names (of those the op supports, sorted) that get a case, per direction
    dtypes: Callable[[object, tuple[str, ...], str], tuple[str, ...]]
    make: Callable[[object, object], list]  # (op, case) -> samples


def _first_of(preferred: tuple[str, ...], fallback: int = 1):
    """The preferred dtypes the op supports; when it supports none of them, its first ``fallback`` dtypes."""

    def choose(op, supported: tuple[str, ...], direction: str) -> tuple[str, ...]:
        chosen = tuple(d for d in preferred if d in supported)
        return chosen or supported[:fallback]

    return choose


# Dtypes whose limits the extremes strategy leaves to their wider or narrower kin: bool has no extremes; int16,
# the rarely implemented unsigned widths and the other complex widths share kernels with the ones kept.
EXTREMES_LEFT_OUT = ("bool", "int16", "uint16", "uint32", "uint64", "complex32", "complex128", "bcomplex32")


def _extreme_dtypes(op, supported: tuple[str, ...], direction: str) -> tuple[str, ...]:
    """Every integer and floating dtype forward (each has its own limits), complex64; float32 backward."""
    if direction == "forward":
        return tuple(d for d in supported if d not in EXTREMES_LEFT_OUT and not d.startswith("float8"))
    return tuple(d for d in ("float32",) if d in supported)


def _sizes_dtypes(op, supported, direction):
    if direction == "backward":
        return tuple(d for d in ("float32",) if d in supported)
    # float32 and int64 (the wide kernels; bfloat16 accumulation shows in OpInfo's own samples), else the first.
    return _first_of(("float32", "int64"))(op, supported, direction)


def _layout_dtypes(op, supported, direction):
    if direction == "backward":
        return tuple(d for d in ("float32",) if d in supported)
    # One dtype per kind of kernel: full and reduced float, integer, bool. (The hypothesis examples add
    # transposed, expanded and strided layouts for the element-wise ops in every float dtype.)
    return _first_of(("float32", "float16", "int64", "bool"))(op, supported, direction)


def _mixed_dtypes(op, supported, direction):
    from .mixed import applies

    if direction != "forward" or not applies(op):
        return ()
    return _first_of(("float32", "float16", "bfloat16", "int32", "int64", "uint8", "bool"))(op, supported, direction)


def _variant_dtypes(op, supported, direction):
    from .variants import applies

    if direction != "forward" or not applies(op):
        return ()
    floats = [d for d in supported if getattr(torch, d).is_floating_point]
    ints = [d for d in supported if not getattr(torch, d).is_floating_point and not getattr(torch, d).is_complex
            and d != "bool"]
    chosen = (["float32"] if "float32" in floats else floats[:1]) + (["int64"] if "int64" in ints else ints[:1])
    return tuple(chosen) or supported[:1]


def _registry() -> dict[str, Strategy]:
    from . import accumulation, extremes, layouts, mixed, sizes, ties, variants

    return {
        "sizes": Strategy(name="sizes", description="lengths across tile boundaries and long reductions",
                        dtypes=_sizes_dtypes, make=sizes.make_samples),
        "extremes": Strategy(name="extremes", description="integer limits, 2^24 and 2^31, fp specials",
                           dtypes=_extreme_dtypes, make=extremes.make_samples),
        "mixed": Strategy(name="mixed", description="mixed dtypes, 0-d tensors and Python scalars",
                        dtypes=_mixed_dtypes, make=mixed.make_samples),
        "layouts": Strategy(name="layouts", description="transposed, step-sliced, expanded, channels-last, offset",
                          dtypes=_layout_dtypes, make=layouts.make_samples),
        "variants": Strategy(name="variants", description="in-place, out= and view aliasing",
                           dtypes=_variant_dtypes, make=variants.make_samples),
        "ties": Strategy(name="ties", description="tied values for ops that return indices of tied elements",
                       dtypes=ties.tie_dtypes, make=ties.make_samples),
        "accumulation": Strategy(name="accumulation",
                               description="float16 and bfloat16 rows up to 65,536 along the dimensions summed",
                               dtypes=accumulation.accumulation_dtypes, make=accumulation.make_samples),
    }


_STRATEGIES: dict[str, Strategy] | None = None


def strategy(name: str) -> Strategy:
    global _STRATEGIES
    if _STRATEGIES is None:
        _STRATEGIES = _registry()
    if name not in _STRATEGIES:
        import difflib

        close = difflib.get_close_matches(name, STRATEGIES, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ValueError(f"unknown input strategy {name!r}{hint} (strategies: {', '.join(STRATEGIES)})")
    return _STRATEGIES[name]


def strategy_samples(op, case) -> list:
    """The samples of a strategy case, made on the CPU, deterministic for its seed."""
    samples = strategy(case.config["inputs"]).make(op, case)
    if not samples:
        raise StrategyNotApplicable(f"the op's samples give the {case.config['inputs']} strategy nothing to transform")
    return samples


__all__ = ["STRATEGIES", "Strategy", "StrategyNotApplicable", "strategy", "strategy_samples"]
