"""The judge: the one place where verdict policy lives.

Op cases, model cases, the localiser, loss curves and ``neuron-validate`` all
ask it the same question: given what the target computed and what the CPU
reference computed, is the target right? It answers in this order:

1. **compare** (diff.compare): dtype, shape, device, NaN/inf positions, and
   values within the dtype's tolerance. Equal enough: ``pass``.
2. **float64 golden**: only values differ, so the float64 result is computed
   (lazily: most cases never need it). A target more accurate than the CPU,
   or within a small multiple of the CPU's own error against float64 (PyTorch's
   benchmark ``same()`` rule), passes.
3. **determinism rerun**: still different, so the reference runs again. When
   the CPU does not reproduce its own result, the values cannot be judged:
   the verdict is ``inconclusive`` if dtype, shape and device agree, else
   ``mismatch``. Never a silent pass.
4. **noise floor** (diff.precision), for a target whose precision model names
   ops it computes at lower precision: the reference runs K more times with
   those ops perturbed at the model's unit roundoff. A deviation within a
   multiple of that spread passes, marked "within device precision" with the
   significant bits kept; anything beyond is a ``mismatch``. A reference
   whose spread leaves no significant bit cannot be judged as a whole: its
   ops are judged one by one from the reference's inputs to each
   (diff.replay). An op off is a ``mismatch``; all ops agreeing leaves it
   ``inconclusive``, with its condition estimate. Never a pass.

Random outputs (rule "distribution") are compared by a two-sample test that
takes their elements for independent draws. Where they are not (attention's
dropout mask is shared along the value dimension: 1,536 elements, 12 rows of
draws), the reference runs again on other random streams: a target whose
distance from the reference is within ``DRAW_BAND_MULTIPLE`` times the largest
between the reference's own draws passes.

It also holds the one classification of errors a side raised
(:func:`classify_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from conformance.outcome import Status

from .compare import Comparison, Mismatch, compare, ks_distance
from .precision import NoiseFloor, PrecisionModel, noise_floor
from .replay import OpReplay

# What a backend says when it does not implement something, as opposed to failing at it.
UNSUPPORTED_MARKERS = (
    "not implemented for",
    "not currently implemented",
    "could not run 'aten::",
    "is not supported",
    "notimplementederror",
    "is only supported on",
)


def classify_error(error: BaseException | str, error_type: str | None = None) -> Status:
    """``unsupported`` when the target says it does not implement the thing, else ``error``."""
    if isinstance(error, BaseException):
        error_type = type(error).__name__
        text = f"{error_type}: {error}"
    else:
        text = error
    lowered = text.lower()
    if error_type == "NotImplementedError" or any(m in lowered for m in UNSUPPORTED_MARKERS):
        return Status.UNSUPPORTED
    return Status.ERROR


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """``Type: first line of the message``, for outcome messages."""
    if isinstance(error, BaseException):
        lines = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {lines[0] if lines else ''}".strip()
    else:
        text = (error.strip().splitlines() or [""])[0]
    return text[:limit]


Lazy = Callable[[], Any]

DRAW_RUNS = 4  # reference runs on other random streams, for an output judged by distribution
# The target's KS distance from the reference may be this many times the largest between the reference's own draws
# (the largest of 4 null draws is near the Kolmogorov distribution's median; 3x that is past its 1e-6 quantile).
DRAW_BAND_MULTIPLE = 3.0


@dataclass(kw_only=True)
class Judgement:
    """Truthy when the target passes; carries the comparison that decided it."""

    status: Status
    comparison: Comparison
    golden_used: bool = False
    golden_error: str | None = None
    nondeterministic: bool = False
    notes: list[str] = field(default_factory=list)
    noise: NoiseFloor | None = None  # the noise-floor verdict, where one was formed
    precision: PrecisionModel | None = None
    replay: OpReplay | None = None  # the op-by-op check of an ill-conditioned whole, where one ran

    def __bool__(self) -> bool:
        return self.status is Status.PASS

    @property
    def within_precision(self) -> bool:
        """A pass that needed the device's precision model (not a plain match)."""
        return self.status is Status.PASS and self.noise is not None and self.noise.within

    @property
    def ill_conditioned(self) -> bool:
        """Inconclusive because the reference keeps no significant bit under the device's precision (the
        condition estimate is in ``noise``), not because the CPU does not reproduce itself: an input that is
        better conditioned may be judged where this one cannot."""
        return (self.status is Status.INCONCLUSIVE and not self.nondeterministic and self.noise is not None
                and self.noise.inconclusive)

    @property
    def decided(self) -> Comparison:
        """The comparison as the judge decided it: a pass within device precision keeps its statistics, lists
        no mismatch and says what let it pass (for callers that keep a Comparison, such as the localiser)."""
        if self.status is not Status.PASS or self.comparison:
            return self.comparison
        return Comparison(leaves=self.comparison.leaves, worst=dict(self.comparison.worst),
                          passed_by={**self.comparison.passed_by, "device precision": self.comparison.leaves})

    @property
    def message(self) -> str:
        if self.replay is not None and self.replay.first:
            return (f"ill-conditioned as a whole (condition estimate {self.noise.condition:.3g} at {self.noise.worst} "
                    f"under the device's precision); {self.replay.describe()}")
        if self.replay is not None:
            return f"{self.noise.describe(self.precision)}; {self.replay.describe()}"
        if self.noise is not None and (self.status is not Status.MISMATCH or not self.noise.within):
            return self.noise.describe(self.precision) + (
                "" if self.status is not Status.MISMATCH else f"; {self.comparison.summary()}")
        if self.status is Status.INCONCLUSIVE:
            return ("the CPU reference does not reproduce its own result, so only dtype, shape and device are "
                    "compared (they agree)")
        return self.comparison.summary()


@dataclass(frozen=True, slots=True, kw_only=True)
class Judge:
    """Judges one target result against the reference: see the module docstring.

    ``tolerance``: a Tolerance or a dtype -> Tolerance function (diff.tolerances);
    ``device``: the device type every target tensor must be on; ``rule``:
    "values", "distribution" (random ops) or "metadata" (see diff.compare).
    """

    tolerance: Any = None
    device: str | None = None
    rule: str = "values"
    precision: PrecisionModel | None = None  # the target's; None or empty: no noise floor

    def __call__(self, actual: Any, expected: Any, *, golden: Any | Lazy = None,
                 reference_again: Lazy | None = None, noise: Callable[[], list] | None = None,
                 by_op: Callable[[], OpReplay] | None = None, draws: Callable[[], list] | None = None,
                 path: str = "output") -> Judgement:
        """``golden``: the float64 result, or a function that computes it when needed (its failure is
        noted, not raised); ``reference_again``: a function that runs the reference once more;
        ``noise``: a function that returns perturbed reference runs (diff.precision.perturbed_runs);
        ``by_op``: a function that judges the reference's ops one by one on the target (diff.replay);
        ``draws``: a function that returns reference runs on other random streams (rule "distribution")."""
        options = dict(tolerance=self.tolerance, device=self.device, path=path)
        result = compare(actual, expected, rule=self.rule, **options)
        if result:
            return Judgement(status=Status.PASS, comparison=result)
        judgement = Judgement(status=Status.MISMATCH, comparison=result)
        if draws is not None and self.rule.startswith("distribution"):
            return _within_draws(judgement, expected, draws, path)
        if not all(m.kind in ("values", "nonfinite") for m in result.mismatches):
            return judgement  # a wrong dtype, shape, device or structure is wrong whatever float64 says
        # The noise floor first where the target has a precision model: a difference its documented precision
        # explains passes without a golden run or a rerun (what a zoo case with the noise floor may cost).
        floor = None
        if self.precision and noise is not None and self.rule == "values":
            floor = noise_floor(actual, expected, noise(), self.precision, path=path,
                                only={m.path for m in result.mismatches})
            if floor is not None:
                judgement.noise, judgement.precision = floor, self.precision
                if floor.within and not floor.inconclusive:
                    judgement.status = Status.PASS
                    return judgement
        value = golden
        if callable(golden):
            try:
                value = golden()
            except Exception as exc:  # noqa: BLE001 - no golden: judged against the reference alone
                value = None
                judgement.golden_error = one_line(exc)
        if value is not None:
            judgement.golden_used = True
            judgement.comparison = compare(actual, expected, golden=value, rule=self.rule, **options)
            if judgement.comparison:
                judgement.status = Status.PASS
                judgement.noise = None  # today's golden band passes it: no precision needed
                return judgement
        if floor is not None and floor.inconclusive and floor.within:  # nothing judged failed; the rest cannot be
            judgement.status = Status.INCONCLUSIVE
            if by_op is not None:  # the whole cannot be judged; each op alone can
                judgement.replay = by_op()
                if not judgement.replay:
                    judgement.status = Status.MISMATCH
            return judgement
        if reference_again is not None:
            again = reference_again()
            if again is not None and not compare(again, expected, rule="values", tolerance=self.tolerance):
                judgement.nondeterministic = True
                judgement.comparison = compare(actual, expected, rule="metadata", **options)
                judgement.status = Status.INCONCLUSIVE if judgement.comparison else Status.MISMATCH
        return judgement


def _within_draws(judgement: Judgement, expected: Any, draws: Callable[[], list], path: str) -> Judgement:
    """A random output that failed the two-sample test, judged against the spread of the reference's own draws:
    a pass where the target's KS distance is within ``DRAW_BAND_MULTIPLE`` times the largest distance between the
    reference and its runs on other streams, for every failing tensor; else the mismatch, saying how far they were."""
    import torch
    from torch.utils._pytree import keystr, tree_flatten, tree_flatten_with_path

    result = judgement.comparison
    if not all(m.kind == "distribution" and "ks_statistic" in m.metrics for m in result.mismatches):
        return judgement  # NaN on one side only, a constant reference, a wrong shape: not a matter of draws
    keyed, spec = tree_flatten_with_path(expected)
    names = [path + keystr(key) for key, _ in keyed]
    failing = {m.path for m in result.mismatches}
    if not failing <= set(names):
        return judgement
    runs = draws()
    spread: dict[str, float] = {}
    for run in runs:
        leaves, run_spec = tree_flatten(run)
        if run_spec != spec:
            return judgement
        for name, (_, e), r in zip(names, keyed, leaves):
            if name in failing and isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) and r.shape == e.shape:
                spread[name] = max(spread.get(name, 0.0), ks_distance(r, e))
    if set(spread) != failing:
        return judgement
    beyond = [m for m in result.mismatches if m.metrics["ks_statistic"] > DRAW_BAND_MULTIPLE * spread[m.path]]
    band = (f"{DRAW_BAND_MULTIPLE:g}x the largest KS distance between the reference and its own draws on "
            f"{len(runs)} other streams ({{:.3f}})")
    if not beyond:
        judgement.status = Status.PASS
        judgement.comparison = Comparison(leaves=result.leaves, worst=dict(result.worst),
                                          passed_by={**result.passed_by, "reference draws": len(failing)})
        judgement.notes.append("; ".join(f"{m.path}: KS {m.metrics['ks_statistic']:.3f}, within "
                                         + band.format(spread[m.path]) for m in result.mismatches))
        return judgement
    judgement.comparison = Comparison(
        leaves=result.leaves, worst=dict(result.worst), passed_by=dict(result.passed_by),
        mismatches=[Mismatch(path=m.path, kind=m.kind, metrics={**m.metrics, "ks_reference_draws": spread[m.path]},
                             message=f"{m.message}; beyond {band.format(spread[m.path])}")
                    for m in result.mismatches])
    return judgement


__all__ = ["Judge", "Judgement", "UNSUPPORTED_MARKERS", "classify_error", "one_line"]
