"""``neuron-conformance curves``: a zoo model's loss curves on both sides, judged against the band."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

MODEL = "hf/gpt2:causal_lm"


def curves(tmp_path, *args, faults: str = "", steps: int = 3):
    out = tmp_path / "curves"
    result = run_cli("neuron-conformance", "curves", "--model", MODEL, "--steps", str(steps), "--target", "neuron",
                     "--out", str(out), *args, env={"NEURON_VALIDATE_FAULTS": faults}, timeout=600)
    return result, out


def test_agreeing_curves_write_plot_and_data(tmp_path):
    result, out = curves(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict: AGREE" in result.stdout
    record = json.loads((out / "curves.json").read_text())
    assert record["config"]["batch"] == 16, "the fixed task has at least MIN_BATCH examples"
    assert record["data"] == {"kind": "fixed", "batches": 1}
    assert len(record["comparison"]["reference"]["losses"]) == 3 and record["comparison"]["perturbed_runs"] == 2
    assert (out / "loss_curves.png").stat().st_size and (out / "loss_curves.svg").stat().st_size


def test_wrong_gradients_diverge(tmp_path):
    result, out = curves(tmp_path, faults="perturb@aten::mm,rel=0.5,phase=backward", steps=6)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DIVERGE at step" in result.stdout
    assert not json.loads((out / "curves.json").read_text())["comparison"]["ok"]


@pytest.mark.parametrize("args, needle", [
    (["--steps", "0"], "--steps 0: must be at least 1"),
    (["--model", "hf/gtp2:causal_lm"], "closest: hf/gpt2:causal_lm"),
])
def test_bad_usage_is_one_line(tmp_path, args, needle):
    result = run_cli("neuron-conformance", "curves", "--model", MODEL, "--out", str(tmp_path / "c"), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "c").exists()


def test_a_target_that_cannot_train_diverges(tmp_path):
    result, out = curves(tmp_path, faults="raise@aten::mm")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "fails to train on the target" in result.stdout and "the target did not train" in result.stdout
    assert not (out / "curves.json").exists()
