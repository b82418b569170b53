"""Loss curves of a zoo model on the reference and the target (``neuron-conformance curves``).

The same question neuron-validate asks of a user's training script, "does it learn the same way?",
asked of a zoo model: build it once (fixed seed, dropout off), train a copy on each side for N steps
on the same batches with the zoo's optimizer, compare the curves against the band (:mod:`diff.curves`,
perturbed reference trainings included) and write ``loss_curves.png`` / ``.svg`` and ``curves.json``.

The data is a task the model can learn: the same few batches (``data="fixed"``), at least
:data:`MIN_BATCH` examples each so batch norm sees a batch, which the model fits, so both curves fall
and the band tells drift by design from divergence. ``data="fresh"`` draws a new random batch each
step (unlearnable: the curves only wander).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from diff.curves import NOISE_RUNS, CurveComparison, CurveTolerance, LossCurve, compare_curves, curve_precision, train_curve
from diff.judge import one_line
from diff.plots import plot_curves
from diff.precision import PrecisionModel, model_for, perturbed_runs
from model_zoo import BuiltModel, ModelConfig, build

MIN_BATCH = 16  # the default batch of the learnable task: batch norm over 2 images only wanders
SIDES = ("reference", "target")


class SideFailedToTrain(Exception):
    """One side's training raised: ``side`` is "reference" or "target", the cause is chained."""

    def __init__(self, side: str, label: str, error: BaseException) -> None:
        super().__init__(f"fails to train on the {side} ({label}): {one_line(error)}")
        self.side = side


@dataclass(frozen=True, slots=True, kw_only=True)
class ZooTraining:
    """A built zoo model and the task both sides train it on."""

    name: str  # as asked for (the zoo name)
    config: ModelConfig
    built: BuiltModel
    steps: int
    seed: int
    data: str  # "fixed" or "fresh"
    fixed_batches: tuple[dict, ...] | None

    def batch(self, step: int) -> dict:
        if self.fixed_batches is not None:
            return dict(self.fixed_batches[step % len(self.fixed_batches)])
        return self.built.make_batch(step)

    def loss(self, model, inputs):
        return self.built.loss_fn(model(**inputs), inputs)

    def train(self, target, *, label: str | None = None, on_step: Callable[[int, float], None] | None = None,
              as_target: bool = True) -> LossCurve:
        """One side's curve on ``target`` (a conformance Target); ``as_target=False`` trains plainly on its
        device (the perturbed reference runs: no compile wrapper, no synchronisation)."""
        kwargs: dict[str, Any] = {}
        if as_target:
            kwargs = dict(prepare=target.prepare if target.compiles else None, synchronize=target.synchronize,
                          on_step=on_step)
        return train_curve(self.built.model, device=target.device, label=label or target.describe(),
                           batch=self.batch, loss=self.loss, optimizer_factory=self.built.optimizer_factory,
                           steps=self.steps, seed=self.seed, **kwargs)


def zoo_training(*, model: str, steps: int, dtype: str = "float32", batch: int = 0, size: int = 0, seed: int = 0,
                 data: str = "fixed", data_batches: int = 1) -> ZooTraining:
    """Builds ``model`` for training; raises ValueError or model_zoo.ModelZooError for a config it cannot
    build (an unknown name lists the closest ones). ``batch=0`` with fixed data is at least MIN_BATCH."""
    config = ModelConfig(arch=model, dtype=dtype, batch=batch, size=size, mode="steps", steps=steps, seed=seed)
    built = build(config)
    if data == "fixed" and not batch and built.config and built.config.batch < MIN_BATCH:
        config = ModelConfig(arch=model, dtype=dtype, batch=MIN_BATCH, size=size, mode="steps", steps=steps, seed=seed)
        built = build(config)
    fixed = tuple(built.make_batch(k) for k in range(data_batches)) if data == "fixed" else None
    return ZooTraining(name=model, config=built.config or config, built=built, steps=steps, seed=seed, data=data,
                       fixed_batches=fixed)


def train_sides(training: ZooTraining, reference, target,
                on_step: Callable[[str], Callable[[int, float], None]] | None = None) -> dict[str, LossCurve]:
    """Both sides' curves, by side; ``on_step(side)`` gives that side's per-step callback. A side that raises
    is :class:`SideFailedToTrain` (the reference first: a reference that cannot train judges nothing)."""
    curves = {}
    for side, t in zip(SIDES, (reference, target)):
        try:
            curves[side] = training.train(t, on_step=on_step(side) if on_step else None)
        except Exception as exc:  # noqa: BLE001 - any failure to train is the side's result
            raise SideFailedToTrain(side, t.describe(), exc) from exc
    return curves


def band_precision(target) -> tuple[PrecisionModel | None, PrecisionModel]:
    """The target's precision model (None where it has none) and the one the band's perturbed runs use."""
    precision = model_for(target)
    return precision, curve_precision(precision)


def compare_with_band(training: ZooTraining, curves: dict[str, LossCurve], reference, target,
                      tolerance: CurveTolerance) -> CurveComparison:
    """The curves compared, the band from NOISE_RUNS reference trainings perturbed as the target's precision
    allows (float32 rounding for a target that computes like the CPU)."""
    _, perturbation = band_precision(target)
    perturbed = perturbed_runs(lambda: training.train(reference, label="perturbed reference", as_target=False),
                               perturbation, runs=NOISE_RUNS, seed=training.seed)
    return compare_curves(curves["reference"], curves["target"], tolerance, perturbed)


def write_curves(out: Path, training: ZooTraining, comparison: CurveComparison, tolerance: CurveTolerance,
                 reference, target, *, data_batches: int) -> tuple[Path, Path, Path]:
    """Writes the plot (png, svg) and curves.json (both curves, the comparison, the tolerance, the data, the
    precision model and both sides' manifests); returns the three paths."""
    png, svg = plot_curves(comparison, out / "loss_curves", title=f"{training.name} on {target.describe()}")
    precision, _ = band_precision(target)
    record = {"model": training.name, "config": training.config.to_dict(), "comparison": comparison.to_dict(),
              "tolerance": tolerance.describe(), "data": {"kind": training.data, "batches": data_batches},
              "precision_model": precision.to_dict() if precision else None,
              "manifest": {"target": target.manifest(), "reference": reference.manifest()}}
    data = out / "curves.json"
    data.write_text(json.dumps(record, indent=1, default=str))
    return png, svg, data


__all__ = ["MIN_BATCH", "NOISE_RUNS", "SideFailedToTrain", "ZooTraining", "band_precision", "compare_with_band",
           "train_sides", "write_curves", "zoo_training"]
