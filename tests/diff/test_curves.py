"""diff.curves: the tolerance band, allowed failing steps, the divergence step; tiny-GPT curves; plots."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
import torch.nn.functional as F

import emulator
from diff.curves import CurveTolerance, LossCurve, compare_curves, train_curve
from diff.plots import plot_curves, plot_layers
from tests.conftest import REPO


def curve(losses, label="x", seconds=None):
    return LossCurve(label=label, losses=tuple(losses), step_seconds=tuple(seconds or [0.1] * len(losses)))


def test_identical_curves_agree():
    ref = curve([3.0, 2.5, 2.0, 1.5])
    result = compare_curves(ref, curve(ref.losses))
    assert result and result.diverged_at is None and result.failing_steps == [] and result.max_abs_gap == 0


def test_a_few_noise_spikes_are_allowed():
    ref = [2.0] * 20
    tgt = list(ref)
    tgt[3] = tgt[11] = 2.5  # 25% off, twice: within the 2 allowed for 20 steps
    result = compare_curves(curve(ref), curve(tgt))
    assert result and result.failing_steps == [3, 11] and result.allowed == 2


def test_divergence_step_is_the_start_of_the_run_that_used_up_the_allowance():
    ref = [2.0] * 20
    tgt = list(ref)
    tgt[2] = 3.0  # a spike
    for s in range(9, 20):
        tgt[s] = 2.0 * (1 + 0.1 * (s - 8))  # drifts away from step 9 on
    result = compare_curves(curve(ref), curve(tgt))
    assert not result and result.diverged_at == 9
    assert "diverge at step 9" in result.summary()


def test_band_is_relative_plus_absolute():
    tol = CurveTolerance(rtol=0.05, atol=1e-3, max_failing_steps=0)
    assert compare_curves(curve([1.0]), curve([1.0509]), tol)
    assert not compare_curves(curve([1.0]), curve([1.0511]), tol)


def test_nan_on_one_side_fails_and_on_both_sides_matches():
    tol = CurveTolerance(max_failing_steps=0)
    assert not compare_curves(curve([1.0, 1.0]), curve([1.0, math.nan]), tol)
    assert compare_curves(curve([1.0, math.nan]), curve([1.0, math.nan]), tol)


def test_a_perturbed_run_that_diverges_leaves_the_band_unbounded_not_narrowest():
    """A perturbed reference run whose loss stops being finite says that this training may diverge under the
    device's precision: the band is unbounded from there (not informative), never the narrowest band that
    leaving the run out gave, which failed a target 10% off where the other perturbed run was 0.5% off."""
    ref = curve([2.0, 1.8, 1.6, 1.4, 1.2])
    target = curve([2.0, 1.81, 1.61, 1.54, math.nan])  # 10% off, then NaN, where a perturbed run blew up
    steady = curve([2.0, 1.809, 1.608, 1.407, 1.206])
    blown = curve([2.0, 1.809, 1.608, math.nan, math.nan])
    result = compare_curves(ref, target, perturbed=[steady, blown])
    assert result and not result.informative and result.unbounded_from == 3
    assert "unbounded from step 3" in result.summary() and result.summary().startswith("loss curves not informative")
    assert result.to_dict()["bands"][3] == "inf"
    bounded = compare_curves(ref, target, perturbed=[steady, steady])
    assert not bounded and bounded.unbounded_from is None and bounded.informative  # the target's own gap fails


def test_different_lengths_compare_the_common_steps():
    result = compare_curves(curve([1.0, 0.9, 0.8]), curve([1.0, 0.9]))
    assert result and result.steps == 2 and "first 2" in result.note
    assert not compare_curves(curve([]), curve([]))


@pytest.mark.parametrize("kwargs, message", [
    ({"rtol": -1}, "rtol=-1"),
    ({"atol": float("inf")}, "atol=inf"),
    ({"max_failing_steps": -2}, "max_failing_steps=-2"),
])
def test_bad_tolerances(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CurveTolerance(**kwargs)


def test_speed_ratio_skips_the_first_step():
    ref = curve([1, 1, 1], seconds=[5.0, 0.1, 0.1])
    tgt = curve([1, 1, 1], seconds=[9.0, 0.2, 0.2])
    assert ref.steps_per_second == pytest.approx(10.0)
    assert compare_curves(ref, tgt).speed_ratio == pytest.approx(0.5)


def test_round_trip_through_json_values():
    c = curve([1.0, math.nan, math.inf])
    back = LossCurve.from_dict({**c.to_dict(), "losses": [1.0, None, float("inf")]})
    assert back.losses[0] == 1.0 and math.isnan(back.losses[1])


# ---------------------------------------------------------------- tiny GPT on the emulated device
def _tiny_gpt_module():
    spec = importlib.util.spec_from_file_location("tiny_gpt_example", os.path.join(REPO, "examples", "tiny_gpt.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gpt():
    g = _tiny_gpt_module()
    torch.manual_seed(0)
    model = g.TinyGPT()
    data = g.corpus(2048, torch.Generator().manual_seed(1))
    starts = torch.randint(0, len(data) - g.CONTEXT - 1, (12, 4), generator=torch.Generator().manual_seed(2))

    def batch(step):
        s = starts[step]
        return (torch.stack([data[i:i + g.CONTEXT] for i in s]), torch.stack([data[i + 1:i + g.CONTEXT + 1] for i in s]))

    def loss(m, inputs):
        x, y = inputs
        return F.cross_entropy(m(x).view(-1, g.VOCAB), y.view(-1))

    return model, batch, loss


def _curves(gpt, profile: str, steps: int = 12):
    model, batch, loss = gpt
    common = dict(batch=batch, loss=loss, optimizer_factory=lambda p: torch.optim.AdamW(p, lr=3e-3), steps=steps)
    ref = train_curve(model, device="cpu", label="cpu", **common)
    emulator.set_profile(profile)
    tgt = train_curve(model, device="neuron", label=f"neuron ({profile})", **common)
    return compare_curves(ref, tgt)


def test_tiny_gpt_curves_agree_exactly_under_exact(neuron, gpt):
    result = _curves(gpt, "exact")
    assert result and result.max_abs_gap == 0.0
    assert result.reference.losses[-1] < result.reference.losses[0] - 0.5, "the model learns"


def test_tiny_gpt_curves_show_a_bounded_bf16_gap(neuron, gpt, tmp_path):
    result = _curves(gpt, "matmult-bf16")
    # bf16 operands (8 significant bits) in every matmul: a gap, but a small one (measured: 0.03-0.06%)
    assert result and 1e-5 < result.max_rel_gap < 5e-3
    png, svg = plot_curves(result, tmp_path / "curves", title="tiny GPT")
    assert png.stat().st_size > 10_000 and svg.exists()
    text = svg.read_text()
    assert "reference: cpu" in text and "target: neuron (matmult-bf16)" in text, "both curves are in the legend"
    assert text.count("<path") > 10


def test_layer_plot(tmp_path):
    layers = [{"phase": "forward", "module": f"m{i}", "rel_error": 10.0 ** (-7 + i), "reference_rel_error": 1e-7,
               "ok": i < 2} for i in range(4)]
    png, svg = plot_layers(layers, tmp_path / "layers")
    assert png.exists() and "first diverging: m2" in svg.read_text()


# ---------------------------------------------------------------- neuron-conformance curves
def test_curves_command_agrees_and_writes_the_plot(tmp_path):
    from tests.conftest import run_cli

    result = run_cli("neuron-conformance", "curves", "--model", "robotics/gaussian_mlp", "--steps", "6",
                     "--target", "neuron", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "verdict: AGREE" and lines[-2].startswith(f"plot: {tmp_path / 'loss_curves.png'} ")
    assert "reference: step 6/6" in result.stdout and "target: step 6/6" in result.stdout, "progress is shown"
    assert (tmp_path / "loss_curves.png").stat().st_size > 10_000 and (tmp_path / "loss_curves.svg").exists()
    import json

    record = json.loads((tmp_path / "curves.json").read_text())
    assert record["comparison"]["ok"] and len(record["comparison"]["target"]["losses"]) == 6
    assert record["manifest"]["target"]["emulator_profile"]["name"] == "neuron-2.27"


def test_curves_command_reports_where_a_broken_backward_pass_diverges(tmp_path):
    from tests.conftest import run_cli

    result = run_cli("neuron-conformance", "curves", "--model", "robotics/gaussian_mlp", "--steps", "12",
                     "--out", str(tmp_path), env={"NEURON_VALIDATE_FAULTS": "perturb@aten::mm,rel=1.0,phase=backward"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "verdict: DIVERGE at step" in result.stdout and "loss curves diverge at step" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "robotics/gausian_mlp"], "closest: robotics/gaussian_mlp"),
    (["--model", "robotics/gaussian_mlp", "--steps", "0"], "--steps 0: must be at least 1"),
])
def test_curves_command_bad_usage(args, message):
    from tests.conftest import run_cli

    result = run_cli("neuron-conformance", "curves", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
