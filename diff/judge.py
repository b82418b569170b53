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

It also holds the one classification of errors a side raised
(:func:`classify_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from conformance.outcome import Status

from .compare import Comparison, compare
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
                 by_op: Callable[[], OpReplay] | None = None, path: str = "output") -> Judgement:
        """``golden``: the float64 result, or a function that computes it when needed (its failure is
        noted, not raised); ``reference_again``: a function that runs the reference once more;
        ``noise``: a function that returns perturbed reference runs (diff.precision.perturbed_runs);
        ``by_op``: a function that judges the reference's ops one by one on the target (diff.replay)."""
        options = dict(tolerance=self.tolerance, device=self.device, path=path)
        result = compare(actual, expected, rule=self.rule, **options)
        if result:
            return Judgement(status=Status.PASS, comparison=result)
        judgement = Judgement(status=Status.MISMATCH, comparison=result)
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


__all__ = ["Judge", "Judgement", "UNSUPPORTED_MARKERS", "classify_error", "one_line"]
