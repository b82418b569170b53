"""Each example script gets the verdict and the findings its design implies (default neuron-2.27 profile).

These run the installed command end to end: child processes, the emulated
device, reports on disk. The expectations are written in each example's
docstring.
"""

from __future__ import annotations

import os

from tests.validate.conftest import example


def _line_of(path: str, marker: str) -> int:
    with open(path) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line)


def test_tiny_gpt_under_the_default_profile_is_ready_within_device_precision(validate):
    """GELU from the activation tables differs from the CPU by design: within the noise floor of perturbed
    reference runs, so neither a layer nor the curves are flagged (the band comes from those runs)."""
    run = validate(example("tiny_gpt.py"))
    assert run.returncode == 0, run.stderr
    r = run.report
    assert r["verdict"] == "ready" and r["script"]["convention"] == "training", run.stdout
    (numerics,) = run.findings("numerics", "info")
    assert "within device precision" in numerics["title"]
    assert r["curves"]["ok"] and r["curves"]["steps"] == 30 and r["curves"]["perturbed_runs"] == 2
    assert len(r["curves"]["bands"]) == 30
    assert run.findings("runs", "info") and run.findings("speed")
    assert not run.findings(severity="error") and not run.findings(severity="warning")
    # the terminal summary ends with the verdict and the report paths
    assert "verdict: READY" in run.stdout and "report.html" in run.stdout


def test_tiny_gpt_under_exact_is_ready(validate):
    run = validate(example("tiny_gpt.py"), "--emulator-profile", "exact")
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert run.report["curves"]["max_abs_gap"] == 0


def test_vision_classifier_is_ready(validate):
    run = validate(example("vision_classifier.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert run.report["script"]["convention"] == "functions"
    assert run.report["model"]["loss"] == "loss_fn(output)"
    assert run.findings("numerics", "info") and run.report["curves"]["ok"]


def test_device_bug_is_not_ready_and_points_at_both_bugs(validate):
    path = example("device_bug.py")
    run = validate(path)
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    errors = run.findings("placement", "error")
    mixed = {f["title"].split()[0]: f for f in errors}
    assert set(mixed) == {"aten::masked_fill", "aten::add"}
    assert mixed["aten::masked_fill"]["where"].endswith(f"device_bug.py:{_line_of(path, 'scores.masked_fill')} in forward")
    assert f"device_bug.py:{_line_of(path, 'bug 1')}" in mixed["aten::masked_fill"]["hint"]
    assert "positions" in mixed["aten::add"]["hint"]
    warnings = {f["subject"].split(":")[0] for f in run.findings("placement", "warning")}
    assert warnings == {"cpu_tensor", "plain"}
    assert run.findings("runs", "info"), "the emulated device runs it (silently copying): the report says why it is not ready"


def test_spectral_filter_is_ready_with_host_fallback_warnings(validate):
    path = example("spectral_filter.py")
    run = validate(path)
    assert run.returncode == 0 and run.report["verdict"] == "ready with warnings", run.stdout
    fallback = {f["subject"]: f for f in run.findings("host-fallback", "warning")}
    assert {"aten::_fft_r2c", "aten::_fft_c2r"} <= set(fallback)
    assert fallback["aten::_fft_r2c"]["where"].endswith(f"spectral_filter.py:{_line_of(path, 'rfft(x')} in forward")
    assert {f["severity"] for f in run.report["findings"]} == {"warning", "info"}
    assert run.findings("numerics", "info"), "the host computes it exactly"


def test_varying_shapes_recompile_in_compile_mode(validate):
    run = validate(example("varying_shapes.py"), "--mode", "compile")
    assert run.returncode == 0 and run.report["verdict"] == "ready with warnings", run.stdout
    (recompile,) = run.findings("recompilation", "warning")
    assert "6 different input shapes" in recompile["title"]
    assert recompile["data"]["varying"][0]["values"] == [9, 14, 23, 31, 40, 52]
    assert "pad input" in recompile["hint"]
    assert run.findings("wide-dtypes"), "int64 token ids are narrowed in compiled graphs"
    assert run.report["mode"] == "compile" and "torch.compile" in run.report["target"]["label"]


def test_recompilation_is_counted_on_a_backend_that_is_not_the_emulator(validate):
    """Graphs are counted where dynamo hands them to the backend: inductor on the CPU recompiles per length too."""
    run = validate(example("varying_shapes.py"), "--target", "cpu:compile")
    assert run.returncode == 0 and run.report["verdict"] == "ready with warnings", run.stdout
    (recompile,) = run.findings("recompilation", "warning")
    assert recompile["title"] == "compiled 6 times for 6 different input shapes"  # each length once, none twice
    assert recompile["data"]["varying"] == [{"input": 1, "dim": 1, "values": [9, 14, 23, 31, 40, 52]}]


def test_perturbed_block_is_ready_without_a_fault(validate):
    run = validate(example("perturbed_block.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout


def test_perturbed_block_names_the_layer_and_op_under_a_fault(validate):
    path = example("perturbed_block.py")
    run = validate(path, env={"NEURON_VALIDATE_FAULTS": "perturb@aten::atan,rel=0.01"})
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["culprit"] == "blocks.2" and numerics["data"]["op"] == "aten::atan"
    assert numerics["where"].endswith(f"perturbed_block.py:{_line_of(path, 'torch.atan(h)')} in forward")
    assert "blocks.2" in run.stdout and "aten::atan" in run.stdout
    assert run.report["manifest"]["target"]["emulator_active_faults"] == ["perturb@aten::atan,rel=0.01"]


def test_reports_are_complete_and_self_contained(validate):
    run = validate(example("tiny_gpt.py"))
    r = run.report
    manifest = r["manifest"]
    assert manifest["target"]["emulator_profile"]["name"] == "neuron-2.27"
    assert manifest["target"]["torch"] and manifest["reference"]["kind"] == "cpu"
    assert "NEURON_VALIDATE_EMULATOR_AUTOLOAD" in manifest["reference"]["env"], "the reference's environment is kept"
    assert len(r["script"]["sha256"]) == 64 and r["command"][0] == "neuron-validate"
    html = open(os.path.join(run.out, "report.html")).read()
    assert html.count("<svg") >= 2 and "src=\"http" not in html and "<link" not in html
    assert "READY" in html and "within device precision" in html
    for name in ("loss_curves.png", "loss_curves.svg", "layers.png", "layers.svg"):
        assert os.path.getsize(os.path.join(run.out, name)) > 1000


DEVICE_DATA = """import torch
device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(8):
    x = torch.randn(32, 8, device=device)  # drawn on the device: the target takes the reference's draws
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_data_drawn_on_the_device_is_the_references_so_both_sides_start_alike(validate, tmp_path_factory):
    """The device's generator differs from the CPU's, yet the target sees the reference's data: the curves
    are compared like for like, and the device's own stream apart, as a distribution."""
    path = tmp_path_factory.mktemp("scripts") / "device_data.py"
    path.write_text(DEVICE_DATA)
    run = validate(str(path))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert not run.findings("same-start")
    (curves,) = run.findings("loss-curves", "info")
    assert curves["data"]["draws_on_device"] == 8
    assert run.findings("random-stream", "info")
    assert run.findings("numerics", "info"), "the first call, compared in one process, still matches"


def test_steps_stop_a_training_script_and_json_goes_to_stdout(validate):
    import json

    run = validate(example("device_bug.py"), "--steps", "4", "--json", "--emulator-profile", "exact")
    report = json.loads(run.stdout)
    assert report["curves"]["steps"] == 4 and report["steps"] == 4
    assert report["verdict"] == "not ready" and run.returncode == 1
    assert report["manifest"]["target"]["emulator_profile"]["name"] == "exact"
    assert "--device" not in report["script"]["args"], "the device option is filled in per side, not recorded"
