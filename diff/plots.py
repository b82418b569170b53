"""Plots of loss curves and of error by depth, as PNG and SVG (matplotlib, no display needed).

Both figures are written twice: PNG to look at, SVG to embed in a
self-contained HTML report. The loss-curve figure puts the two curves side by
side with the tolerance band, their difference, and each side's throughput;
the depth figure shows how the target's error (and the reference's own error
against the float64 golden) grows from layer to layer.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .curves import CurveComparison

REFERENCE_COLOR = "#1f77b4"
TARGET_COLOR = "#d62728"
BAND_COLOR = "#1f77b4"


def _figure(**kwargs):
    """A figure of its own, without pyplot: nothing global to close, no GUI backend, and pyplot's import
    (half a second) saved."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _save(fig, stem: Path) -> list[Path]:
    """Both files of a figure laid out already (``tight_layout``): a tight bounding box on top of it drew the
    figure twice more for every file, a second of a check's time."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    fig.savefig(paths[0], dpi=110)
    fig.savefig(paths[1])
    return paths


def plot_curves(comparison: CurveComparison, stem: str | Path, *, title: str = "loss curves") -> list[Path]:
    """Writes ``stem.png`` and ``stem.svg``: both curves with the band, their difference, and steps/s."""
    ref, tgt = comparison.reference, comparison.target
    n = comparison.steps
    fig = _figure(figsize=(13, 3.8))
    ax_loss, ax_diff, ax_speed = fig.subplots(1, 3, gridspec_kw={"width_ratios": [3, 2, 1.2]})
    steps_r = list(range(ref.steps))
    steps_t = list(range(tgt.steps))
    ax_loss.plot(steps_r, ref.losses, color=REFERENCE_COLOR, label=f"reference: {ref.label}", lw=1.8)
    ax_loss.plot(steps_t, tgt.losses, color=TARGET_COLOR, label=f"target: {tgt.label}", lw=1.4, ls="--")
    if n:
        band = comparison.bands[:n] or [comparison.tolerance.band(x) if math.isfinite(x) else 0.0
                                        for x in ref.losses[:n]]
        lo = [x - b for x, b in zip(ref.losses[:n], band)]
        hi = [x + b for x, b in zip(ref.losses[:n], band)]
        label = "band" + (" (device precision)" if comparison.perturbed else "")
        ax_loss.fill_between(range(n), lo, hi, color=BAND_COLOR, alpha=0.12, label=label)
    if comparison.diverged_at is not None:
        ax_loss.axvline(comparison.diverged_at, color="black", lw=1, ls=":")
        ax_loss.annotate(f"diverge at step {comparison.diverged_at}", (comparison.diverged_at, ax_loss.get_ylim()[1]),
                         xytext=(4, -14), textcoords="offset points", fontsize=8)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(title, fontsize=10)
    ax_loss.legend(fontsize=8)
    ax_loss.grid(alpha=0.3)

    diff = [t - r for r, t in zip(ref.losses[:n], tgt.losses[:n])]
    ax_diff.plot(range(n), diff, color=TARGET_COLOR, lw=1.4, label="target - reference")
    if n:
        ax_diff.plot(range(n), band, color=BAND_COLOR, lw=0.8, ls=":", label="band")
        ax_diff.plot(range(n), [-b for b in band], color=BAND_COLOR, lw=0.8, ls=":")
    failing = [s for s in comparison.failing_steps if s < n and math.isfinite(diff[s])]
    if failing:
        ax_diff.scatter(failing, [diff[s] for s in failing], color="black", s=12, zorder=3, label="outside the band")
    ax_diff.axhline(0, color="grey", lw=0.6)
    ax_diff.set_xlabel("step")
    ax_diff.set_title(f"difference (greatest {100 * comparison.max_rel_gap:.2f}%)", fontsize=10)
    ax_diff.legend(fontsize=8)
    ax_diff.grid(alpha=0.3)

    speeds = [ref.steps_per_second or 0.0, tgt.steps_per_second or 0.0]
    bars = ax_speed.bar(["reference", "target"], speeds, color=[REFERENCE_COLOR, TARGET_COLOR])
    for bar, value in zip(bars, speeds):
        ax_speed.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value), ha="center",
                          xytext=(0, 2), textcoords="offset points", fontsize=8)
    ratio = comparison.speed_ratio
    ax_speed.set_title("steps/s" + (f" (target {ratio:.2f}x)" if ratio else ""), fontsize=10)
    ax_speed.grid(alpha=0.3, axis="y")
    verdict = ("agree" if comparison.informative else "not informative") if comparison else "diverge"
    fig.suptitle(f"{title}: {verdict}", fontsize=11)
    fig.tight_layout()
    return _save(fig, Path(stem))


def _get(item: Any, key: str):
    return item[key] if isinstance(item, Mapping) else getattr(item, key)


def plot_layers(layers: Sequence[Any], stem: str | Path, *, title: str = "error by depth") -> list[Path]:
    """Writes ``stem.png`` and ``stem.svg``: each forward module call's relative error, target and reference.

    ``layers`` are :class:`diff.localize.LayerError` objects or their ``to_dict()`` mappings.
    """
    forward = [x for x in layers if _get(x, "phase") == "forward"]
    floor = 1e-12
    target = [max(_get(x, "rel_error") or 0.0, floor) for x in forward]
    reference = [_get(x, "reference_rel_error") for x in forward]
    fig = _figure(figsize=(max(6.0, 0.28 * len(forward) + 2), 3.8))
    ax = fig.subplots()
    xs = list(range(len(forward)))
    ax.semilogy(xs, target, color=TARGET_COLOR, marker="o", ms=3, lw=1.2, label="target vs golden")
    if any(r is not None and not (isinstance(r, float) and math.isnan(r)) for r in reference):
        ax.semilogy(xs, [max(r or 0.0, floor) if r is not None else floor for r in reference], color=REFERENCE_COLOR,
                    marker="o", ms=3, lw=1.0, ls="--", label="reference vs golden")
    bad = [i for i, x in enumerate(forward) if not _get(x, "ok")]
    if bad:
        ax.axvline(bad[0], color="black", lw=1, ls=":")
        ax.annotate(f"first diverging: {_get(forward[bad[0]], 'module')}", (bad[0], max(target)),
                    xytext=(4, -12), textcoords="offset points", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels([_get(x, "module") for x in forward], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("relative RMS error")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, Path(stem))


__all__ = ["plot_curves", "plot_layers"]
