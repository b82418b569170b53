"""Loss curves: train the same model the same way on two sides and compare the losses step by step.

A model can compute every step a little differently and still learn the same
way, or pass a one-step check and drift apart over a hundred. So the question
"does it learn the same way?" is answered on the curve: each step's target
loss must lie within a band around the reference loss, ``atol + rtol *
|reference|``. Like Megatron-LM's approximate mode (rtol 5% on the loss), a
few steps may fall outside the band (noise spikes) before the curves count as
diverged; the step at which they diverge is the start of the run of failing
steps that used up the allowance. NaN or inf on one side only always fails.

Where perturbed reference runs exist, the band comes from them instead: the
reference trained again with the ops of the target's precision model
(diff.precision) perturbed at its unit roundoff, drawing the same random
numbers (diff.draws), or, for a target that computes like the CPU, every op's
result at float32's (:func:`curve_precision`: what another order of a sum
changes; :func:`band_precision` says when they are needed). Their gap to the reference grows with
the steps, as the device's own drift does; the band at each step is
``SPREAD_MULTIPLE`` times that spread (its largest relative value so far, so
a step where the perturbed curves happen to cross the reference does not
narrow it), at least ``PERTURBED_FLOOR_RTOL`` of the loss, and at least the
fixed band when ``rtol`` was set by hand. A fixed 5% would let a dropped
rank's gradients (a 0.4% gap after 20 steps) pass.

:func:`train_curve` runs the training loop for one side (used by
``neuron-conformance curves`` and by ``neuron-validate``); an unchanged
training script's losses come from its own ``backward()`` calls instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

DEFAULT_RTOL = 0.05  # Megatron-LM's approximate loss check
DEFAULT_ATOL = 1e-4
NOISE_RUNS = 2  # perturbed reference trainings behind the band
PERTURBED_FLOOR_RTOL = 1e-3  # the narrowest band perturbed runs may give, relative to the loss
# A band wider than this shift of the loss (relative, at the last step) could not see a real change: such a
# comparison is "not informative", never "agree".
INFORMATIVE_SHIFT = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class LossCurve:
    """One side's losses, one per training step, and the wall time of each step in seconds."""

    label: str
    losses: tuple[float, ...]
    step_seconds: tuple[float, ...] = ()

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def steps_per_second(self) -> float | None:
        """Throughput after the first step (which carries warm-up and compilation)."""
        times = self.step_seconds[1:] if len(self.step_seconds) > 1 else self.step_seconds
        total = sum(times)
        return len(times) / total if times and total > 0 else None

    def to_dict(self) -> dict:
        return {"label": self.label, "losses": [json_float(x) for x in self.losses],
                "step_seconds": list(self.step_seconds), "steps_per_second": self.steps_per_second}

    @classmethod
    def from_dict(cls, data: dict) -> "LossCurve":
        return cls(label=data["label"], losses=tuple(math.nan if x is None else float(x) for x in data["losses"]),
                   step_seconds=tuple(float(x) for x in data.get("step_seconds", ())))


def json_float(x: float):
    """A float as strict JSON holds it: NaN as null, infinities as "inf" and "-inf"."""
    return x if math.isfinite(x) else (None if math.isnan(x) else ("inf" if x > 0 else "-inf"))


@dataclass(frozen=True, slots=True, kw_only=True)
class CurveTolerance:
    """The band around the reference loss and how many steps may leave it (None: 10% of the steps, at least 1)."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    max_failing_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} (type={type(value).__name__}): expected a finite number >= 0")
        if self.max_failing_steps is not None and (not isinstance(self.max_failing_steps, int) or self.max_failing_steps < 0):
            raise ValueError(f"max_failing_steps={self.max_failing_steps!r} (type={type(self.max_failing_steps).__name__}): "
                             "expected None or an int >= 0")

    def allowed(self, steps: int) -> int:
        return self.max_failing_steps if self.max_failing_steps is not None else max(1, steps // 10)

    def band(self, reference: float) -> float:
        return self.atol + self.rtol * abs(reference)

    def describe(self) -> str:
        allowed = "10% of the steps (at least 1)" if self.max_failing_steps is None else str(self.max_failing_steps)
        return f"|target - reference| <= {self.atol:g} + {self.rtol:g} * |reference|, {allowed} failing steps allowed"


@dataclass(kw_only=True, slots=True)
class CurveComparison:
    """Truthy when the curves agree; ``diverged_at`` is the step where they part (None when they agree)."""

    reference: LossCurve
    target: LossCurve
    tolerance: CurveTolerance
    failing_steps: list[int] = field(default_factory=list)
    diverged_at: int | None = None
    max_abs_gap: float = 0.0
    max_rel_gap: float = 0.0
    note: str = ""
    bands: list[float] = field(default_factory=list)  # the band at each compared step
    perturbed: int = 0  # perturbed reference runs that widened the band (0: the fixed band alone)

    def __bool__(self) -> bool:
        return self.diverged_at is None and not self.note.startswith("no steps")

    @property
    def band_rel(self) -> float:
        """The band's width at the last compared step, beyond ``atol``, relative to the reference loss there."""
        if not self.bands or not self.steps:
            return 0.0
        last = self.reference.losses[self.steps - 1]
        if not math.isfinite(last) or last == 0:
            return 0.0
        return max(0.0, self.bands[self.steps - 1] - self.tolerance.atol) / abs(last)

    @property
    def informative(self) -> bool:
        """Whether the band could see a shift of INFORMATIVE_SHIFT of the loss (a fixed 5% band just can)."""
        return self.band_rel <= INFORMATIVE_SHIFT * (1 + 1e-9)

    @property
    def steps(self) -> int:
        return min(self.reference.steps, self.target.steps)

    @property
    def unbounded_from(self) -> int | None:
        """The first step whose band is unbounded (a perturbed run's loss went non-finite there), if any."""
        return next((step for step, band in enumerate(self.bands) if math.isinf(band)), None)

    @property
    def allowed(self) -> int:
        return self.tolerance.allowed(self.steps)

    @property
    def speed_ratio(self) -> float | None:
        """Target steps/s over reference steps/s."""
        t, r = self.target.steps_per_second, self.reference.steps_per_second
        return t / r if t and r else None

    def summary(self) -> str:
        if self.steps == 0:
            return self.note or "no steps to compare"
        head = (f"{len(self.failing_steps)} of {self.steps} steps outside the band ({self.allowed} allowed); "
                f"greatest gap {self.max_abs_gap:.3g} ({100 * self.max_rel_gap:.2f}% of the reference loss)")
        unbounded = self.unbounded_from
        if unbounded is not None:
            head += (f"; band from {self.perturbed} perturbed reference runs, unbounded from step {unbounded}, "
                     "where a perturbed run's loss stopped being finite and the reference's did not (this "
                     "training may diverge under the device's precision)")
        elif self.perturbed:
            last = self.reference.losses[self.steps - 1]
            width = self.bands[-1] / abs(last) if self.bands and last else 0.0
            head += (f"; band from {self.perturbed} perturbed reference runs, "
                     f"{100 * width:.2f}% at the last step")
        if self and not self.informative:
            if unbounded is not None:
                return f"loss curves not informative: {head}"
            return (f"loss curves not informative: the band is {100 * self.band_rel:.0f}% of the loss, wider than "
                    f"a {100 * INFORMATIVE_SHIFT:.0f}% shift; {head}")
        if self:
            return f"loss curves agree: {head}"
        return f"loss curves diverge at step {self.diverged_at}: {head}"

    def to_dict(self) -> dict:
        return {
            "ok": bool(self), "summary": self.summary(), "steps": self.steps, "failing_steps": self.failing_steps,
            "allowed_failing_steps": self.allowed, "diverged_at": self.diverged_at,
            "max_abs_gap": json_float(self.max_abs_gap), "max_rel_gap": json_float(self.max_rel_gap),
            "rtol": self.tolerance.rtol, "atol": self.tolerance.atol, "speed_ratio": self.speed_ratio,
            "note": self.note, "reference": self.reference.to_dict(), "target": self.target.to_dict(),
            "bands": [json_float(b) for b in self.bands], "perturbed_runs": self.perturbed,
            "band_rel": json_float(self.band_rel), "informative": self.informative,
        }


def compare_curves(reference: LossCurve, target: LossCurve, tolerance: CurveTolerance | None = None,
                   perturbed: Sequence[LossCurve] = (), *, floor_only: bool = False) -> CurveComparison:
    """Compares the common steps of two curves against the band (see the module docstring); ``perturbed``:
    reference curves trained under the target's precision model (diff.precision.perturbed_runs).
    ``floor_only``: perturbed runs were expected and none came; the band is then the narrowest one they may
    give, never the wider fixed band."""
    tol = tolerance or CurveTolerance()
    result = CurveComparison(reference=reference, target=target, tolerance=tol)
    n = min(reference.steps, target.steps)
    if reference.steps != target.steps:
        result.note = (f"the reference ran {reference.steps} steps and the target {target.steps}; "
                       f"the first {n} are compared")
    if n == 0:
        result.note = "no steps to compare: " + (result.note or "both curves are empty")
        return result
    result.bands = precision_bands(reference, perturbed, tol, n, floor_only=floor_only)
    result.perturbed = sum(1 for p in perturbed if p.steps >= n)
    for step in range(n):
        r, t = reference.losses[step], target.losses[step]
        if not (math.isfinite(r) and math.isfinite(t)):
            same = (math.isnan(r) and math.isnan(t)) or r == t
            if not same and not math.isinf(result.bands[step]):  # unbounded: a perturbed run went there too
                result.failing_steps.append(step)
            continue
        gap = abs(t - r)
        result.max_abs_gap = max(result.max_abs_gap, gap)
        if r != 0:
            result.max_rel_gap = max(result.max_rel_gap, gap / abs(r))
        if gap > result.bands[step]:
            result.failing_steps.append(step)
    allowed = tol.allowed(n)
    if len(result.failing_steps) > allowed:
        flip = result.failing_steps[allowed]  # the failing step that used up the allowance
        start = flip
        failing = set(result.failing_steps)
        while start - 1 in failing:
            start -= 1
        result.diverged_at = start
    return result


def precision_bands(reference: LossCurve, perturbed: Sequence[LossCurve], tol: CurveTolerance, n: int, *,
                    floor_only: bool = False) -> list[float]:
    """The band at each of the first ``n`` steps: the fixed band, widened to SPREAD_MULTIPLE times the
    perturbed runs' largest relative gap to the reference so far (perturbed runs shorter than ``n`` are
    left out); with ``floor_only``, the floor alone. Once a perturbed run's loss is not finite where the
    reference's is, the band is unbounded: the device's precision may make this training diverge, and
    leaving that run out gave the narrowest band, which failed a correct device."""
    from .precision import SPREAD_MULTIPLE

    runs = [p for p in perturbed if p.steps >= n]
    bands, relative = [], 0.0
    for step in range(n):
        r = reference.losses[step]
        fixed = tol.band(r) if math.isfinite(r) else 0.0
        if floor_only and math.isfinite(r):
            bands.append(fixed if tol.rtol != DEFAULT_RTOL else tol.atol + PERTURBED_FLOOR_RTOL * abs(r))
            continue
        if not runs or not math.isfinite(r):
            bands.append(fixed)
            continue
        for p in runs:
            x = p.losses[step]
            if not math.isfinite(x):  # the device's precision may make this training diverge: no bound
                relative = math.inf
            elif r != 0:
                relative = max(relative, abs(x - r) / abs(r))
        floor = fixed if tol.rtol != DEFAULT_RTOL else tol.atol + PERTURBED_FLOOR_RTOL * abs(r)
        bands.append(max(floor, SPREAD_MULTIPLE * relative * abs(r)))
    return bands


def band_precision(model, reference_losses: Sequence[float], target_losses: Sequence[float]):
    """The precision model of the band's perturbed runs (an empty one: none are needed). The target's own; for
    a target that computes like the CPU (an empty model), float32 rounding of every op's result, unless its
    curve equals the reference's step for step, where there is no gap for a band to allow.

    The curves are the only check of what the layer comparison does not run: the loss, the optimizer's
    update, every call after the first. A fixed 5% band there let a 2% fault in Adam's update pass."""
    if model or _same_losses(reference_losses, target_losses):
        return model
    return curve_precision(model)


def _same_losses(a: Sequence[float], b: Sequence[float]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def curve_precision(model):
    """The precision model behind a curve's band: the target's, or float32 rounding of every op's result for
    a target that computes like the CPU (its curves may still differ by the order of sums)."""
    from .precision import FP32_U, OpPrecision, PrecisionModel

    if model:
        return model
    return PrecisionModel(name="float32 rounding", source="a target that computes like the CPU",
                          ops=(OpPrecision(pattern="aten::*", rel=FP32_U, reason="float32 rounding"),))


# ---------------------------------------------------------------- training
def train_curve(
    model,
    *,
    batch: Callable[[int], Any],
    loss: Callable[[Any, Any], Any],
    optimizer_factory: Callable[[Any], Any],
    device,
    steps: int,
    label: str,
    seed: int = 0,
    prepare: Callable[[Any], Any] | None = None,
    synchronize: Callable[[], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> LossCurve:
    """Trains a deep copy of ``model`` on ``device`` for ``steps`` steps; returns its loss curve.

    ``batch(step)`` returns that step's inputs on the CPU (moved here),
    ``loss(model, inputs)`` a scalar loss tensor. ``prepare`` wraps the model
    for execution (torch.compile in compile mode). The same ``seed`` is set
    on every side before the first step.
    """
    from conformance.target import EAGER_UNDER_COMPILE, ran_eagerly

    from .sides import run_model

    run = run_model(model, device=device, inputs=batch, forward=loss, loss=lambda value, inputs: value, steps=steps,
                    optimizer_factory=optimizer_factory, prepare=prepare, synchronize=synchronize, on_step=on_step,
                    seed=seed, keep_output=lambda value: None)
    if ran_eagerly(run.runner):  # never a pass: the compiler was not tested
        raise RuntimeError(EAGER_UNDER_COMPILE)
    losses = [float(v.float().cpu()) for v in run.losses]
    seconds = run.step_seconds
    return LossCurve(label=label, losses=tuple(losses), step_seconds=tuple(seconds))


__all__ = ["CurveComparison", "CurveTolerance", "LossCurve", "band_precision", "compare_curves", "curve_precision",
           "train_curve"]
