"""Script inspection, the explanations table, the checks and the verdict, on hand-built observations."""

from __future__ import annotations

import os

import pytest

from validate.checks import CheckContext, check_placement, check_recompilation, check_wide_dtypes, run_checks
from validate.explain import explain
from validate.script import FUNCTIONS, TRAINING, ScriptError, inspect_script
from validate.verdict import NOT_READY, READY, READY_WITH_WARNINGS, Finding, verdict_of

CTX = CheckContext(target="neuron (emulated)", reference="cpu", device="neuron", mode="compile", emulated=True)


def write(tmp_path, text: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- script inspection
def test_functions_convention(tmp_path):
    info = inspect_script(write(tmp_path, "def get_model(): pass\ndef get_inputs(): pass\ndef loss_fn(o): pass\n"))
    assert info.convention == FUNCTIONS and info.model_name == "get_model" and info.has_loss_fn


def test_values_convention(tmp_path):
    info = inspect_script(write(tmp_path, "model = 1\nexample_inputs = 2\n"))
    assert info.convention == FUNCTIONS and info.inputs_name == "example_inputs"


def test_training_script_with_a_device_option(tmp_path):
    info = inspect_script(write(tmp_path, "import argparse\np = argparse.ArgumentParser()\n"
                                          "p.add_argument('--device', default='cpu')\nmodel = 3\nloss.backward()\n"))
    assert info.convention == TRAINING and info.device_option == "--device" and info.calls_backward


def test_the_model_libraries_a_script_imports_are_found_wherever_it_imports_them(tmp_path):
    info = inspect_script(write(tmp_path, "import torch, timm.models\nfrom transformers import AutoModel as A\n"
                                          "def main():\n    from diffusers.models import UNet2DModel\n"
                                          "from .torchvision import x\nimport numpy\nloss.backward()\n"))
    assert info.libraries == ("timm", "transformers", "diffusers")  # a relative import is the script's own module
    assert inspect_script(write(tmp_path, "import torch\nloss.backward()\n")).libraries == ()


@pytest.mark.parametrize("text, message", [
    ("def f(:\n", r"script.py:1: syntax error"),
    ("def get_model(): pass\n", r"defines get_model\(\) but no get_inputs\(\)"),
    ("def get_inputs(): pass\n", r"defines get_inputs but no get_model\(\)"),
])
def test_bad_scripts(tmp_path, text, message):
    with pytest.raises(ScriptError, match=message):
        inspect_script(write(tmp_path, text))


def test_missing_directory_and_wrong_suffix(tmp_path):
    with pytest.raises(ScriptError, match="no such file"):
        inspect_script(str(tmp_path / "nope.py"))
    with pytest.raises(ScriptError, match="is a directory"):
        inspect_script(str(tmp_path))
    with pytest.raises(ScriptError, match=r"ending in \.py"):
        inspect_script(write(tmp_path, "x = 1", name="script.txt"))


# ---------------------------------------------------------------- explanations
PROFILE_2_27 = {"emulator_profile": {"approximate_activations": True, "auto_cast": "none",
                                     "activation_ranges": [["aten::gelu", -16, 16], ["aten::tanh", -16, 16]]}}
PROFILE_BF16 = {"emulator_profile": {"approximate_activations": False, "auto_cast": "matmult", "activation_ranges": []}}


def test_table_activation_within_its_bound_is_explained():
    assert explain("aten::gelu", 1.1e-5, PROFILE_2_27).feature == "activation tables"
    assert explain("aten::gelu_backward", 1e-5, PROFILE_2_27) is not None


def test_a_one_percent_error_is_never_explained():
    assert explain("aten::gelu", 1e-2, PROFILE_2_27) is None, "1% is a wrong op, not a table"
    assert explain("aten::atan", 1e-6, PROFILE_2_27) is None, "atan is not table-driven"


def test_auto_cast_explains_matmuls_only():
    assert explain("aten::addmm", 2.7e-3, PROFILE_BF16).feature == "auto-cast"
    assert explain("aten::add", 2.7e-3, PROFILE_BF16) is None
    assert explain("aten::addmm", 2.7e-3, PROFILE_2_27) is None, "no auto-cast in neuron-2.27"


def test_real_neuron_reads_the_compiler_flags():
    manifest = {"kind": "neuron", "env": {"NEURON_CC_FLAGS": "--auto-cast matmult --auto-cast-type bf16"}}
    assert explain("aten::mm", 1e-3, manifest).feature == "auto-cast"
    assert explain("aten::tanh", 1e-5, manifest).feature == "activation tables"


# ---------------------------------------------------------------- checks
def test_recompilation_names_the_varying_dim_and_suggests_padding():
    events = [{"graph": i, "shapes": [[100, 32], [8, n]], "dtypes": ["float32", "int64"]}
              for i, n in enumerate((9, 14, 23, 31, 40, 52))]
    (finding,) = check_recompilation({"target": {"compile": {"events": events}}}, CTX)
    assert finding.severity == "warning" and "6 times for 6 different input shapes" in finding.title
    assert "input 1 dim 1: 9, 14, 23, 31, 40, 52" in finding.detail
    assert "pad input 1 dim 1 to 52 (1 graph)" in finding.hint and "16, 32, 64: 3 graphs" in finding.hint


def test_recompiling_the_same_shape_is_a_guard_problem():
    events = [{"graph": i, "shapes": [[4, 4]], "dtypes": ["float32"]} for i in range(3)]
    (finding,) = check_recompilation({"target": {"compile": {"events": events}}}, CTX)
    assert "recompiled 2 times for input shapes it had compiled before" in finding.title


def test_a_graph_per_train_and_eval_mode_is_no_recompilation():
    events = [{"graph": i, "shapes": [[4, 4]], "dtypes": ["float32"], "training": mode}
              for i, mode in enumerate((True, False))]
    (finding,) = check_recompilation({"target": {"compile": {"events": events}}}, CTX)
    assert finding.severity == "info" and "switches between model.train() and model.eval()" in finding.title


def test_one_graph_is_fine():
    events = [{"graph": 0, "shapes": [[4, 4]], "dtypes": ["float32"]}]
    (finding,) = check_recompilation({"target": {"compile": {"events": events}}}, CTX)
    assert finding.severity == "info"


def test_wide_dtypes():
    obs = {"target": {"wide_tensors": [
        {"name": "ids", "dtype": "int64", "shape": [2, 3], "fits": True},
        {"name": "big", "dtype": "int64", "shape": [2], "fits": False},
        {"name": "w", "dtype": "float64", "shape": [3], "fits": False}],
        "compile": {"events": [], "narrowing_losses": ["graph 0 input 1 (torch.int64, shape (2,)) changed when narrowed"]}}}
    by_subject = {f.subject: f for f in check_wide_dtypes(obs, CTX)}
    assert by_subject["int64"].severity == "info"
    assert by_subject["int64-overflow"].severity == "warning" and "big (2,)" in by_subject["int64-overflow"].title
    assert by_subject["float64"].severity == "warning"
    assert any(k.startswith("narrowed:") for k in by_subject)


def test_placement_findings_and_the_origin_of_a_cpu_tensor():
    src = lambda line: {"file": "/x/m.py", "line": line, "function": "forward", "text": f"m.py:{line} in forward"}  # noqa: E731
    obs = {"placement_events": [
        {"kind": "cpu_tensor", "op": "aten::ones", "source": src(10), "module": "attn", "count": 1},
        {"kind": "mixed", "op": "aten::masked_fill", "source": src(11), "module": "attn", "count": 1},
        {"kind": "to_host", "op": "aten::_to_copy", "source": src(12), "module": "attn", "count": 3}],
        "target": {"placement": {"cpu_state": [], "plain_tensors": [
            {"name": "pe", "device": "cpu", "shape": [4], "dtype": "float32"}]}}}
    findings = check_placement(obs, CTX)
    mixed = next(f for f in findings if f.subject.startswith("mixed"))
    assert mixed.severity == "error" and "m.py:10" in mixed.hint and mixed.where == "m.py:11 in forward"
    assert {f.severity for f in findings if not f.subject.startswith("mixed")} == {"warning"}
    assert any("(3 times)" in f.title for f in findings)
    assert any("pe (4,)" in f.title and "register_buffer" in f.hint for f in findings)


def test_verdict():
    info = Finding(check="runs", severity="info", title="ok")
    warn = Finding(check="host-fallback", severity="warning", title="w", subject="aten::histc")
    err = Finding(check="numerics", severity="error", title="e")
    assert verdict_of([info]) == READY
    assert verdict_of([info, warn]) == READY_WITH_WARNINGS
    assert verdict_of([warn, err]) == NOT_READY
    assert warn.key == "host-fallback:aten::histc"
    with pytest.raises(ValueError, match="severity='fatal'"):
        Finding(check="x", severity="fatal", title="t")


def test_curves_and_same_start():
    curve = lambda losses: {"label": "x", "losses": losses, "step_seconds": [0.1] * len(losses)}  # noqa: E731
    obs = {"reference": {"curve": curve([2.0, 1.5, 1.0, 0.8]), "fingerprints": {"parameters": "a", "inputs": "b"}},
           "target": {"curve": curve([2.0, 2.0, 2.0, 2.0]), "fingerprints": {"parameters": "c", "inputs": "b"}}}
    findings = run_checks(obs, CTX)
    by_check = {f.check: f for f in findings}
    assert by_check["same-start"].subject == "weights"
    assert by_check["loss-curves"].severity == "warning", "different starting weights: the comparison is inconclusive"
    assert "inconclusive" in by_check["loss-curves"].title and "different weights" in by_check["loss-curves"].title
    assert "initialises or loads the model differently" in by_check["loss-curves"].hint
    obs["target"]["fingerprints"] = {"parameters": "a", "inputs": "z"}
    (start,) = [f for f in run_checks(obs, CTX) if f.check == "same-start"]
    assert start.subject == "data" and "data order" in start.title
    obs["target"]["fingerprints"] = obs["reference"]["fingerprints"]
    findings = run_checks(obs, CTX)
    curves = next(f for f in findings if f.check == "loss-curves")
    assert curves.severity == "error" and "diverge at step 1" in curves.title
    assert verdict_of(findings) == NOT_READY


# ---------------------------------------------------------------- the training side's small decisions
def test_device_arguments_per_side():
    from validate.training import _script_args
    from validate.common import ChildSpec

    spec = ChildSpec(script="s.py", convention="training", side="target", target="neuron", reference="cpu",
                     script_args=("--data", "x", "--on={device}"))
    assert _script_args(spec, "neuron", None) == ["--data", "x", "--on=neuron"]
    assert _script_args(spec, "cpu", "--device") == ["--data", "x", "--on=cpu", "--device", "cpu"]
    explicit = ChildSpec(script="s.py", convention="training", side="target", target="neuron", reference="cpu",
                         script_args=("--device", "{device}"))
    assert _script_args(explicit, "neuron", "--device") == ["--device", "neuron"], "not added twice"


def test_the_device_a_script_names_is_found_in_its_source_its_arguments_or_its_failure(tmp_path):
    from dataclasses import replace

    from validate.run import ValidateOptions, _cuda_missing, _error_names, _script_device

    named = inspect_script(write(tmp_path, 'import torch\nd = torch.device("neuron")\nr = 0\n'
                                           'e = f"neuron:{r}"\nx = torch.ones(2, device="neuron:1")\n'))
    assert named.names_device("neuron") and not named.names_device("cuda") and not named.written_for_cuda
    plain = inspect_script(write(tmp_path, 'import torch\nprint("training on", torch.accelerator.'
                                           'current_accelerator(), torch.cuda.is_available())\n', "plain.py"))
    assert not plain.names_device("neuron") and not plain.written_for_cuda, "it has torch.accelerator"
    cuda = inspect_script(write(tmp_path, 'import torch\nd = "cuda" if torch.cuda.is_available() else "cpu"\n',
                                "cuda.py"))
    assert cuda.written_for_cuda
    with_option = write(tmp_path, 'import argparse, torch\np = argparse.ArgumentParser()\np.add_argument('
                                  '"--device", default="cuda" if torch.cuda.is_available() else "cpu")\n', "option.py")
    assert not inspect_script(with_option).written_for_cuda, "the harness fills --device in"

    options = ValidateOptions(script=plain, target="neuron:compile")
    assert _script_device(options, plain.names_device, cuda=False) is None
    assert _script_device(options, named.names_device, cuda=True) == "neuron", "the target's name first"
    assert _script_device(options, plain.names_device, cuda=True) == "cuda"
    assert _script_device(replace(options, target="cuda"), plain.names_device, cuda=True) is None
    for args in (("--device", "neuron"), ("--dev=neuron:0",)):
        assert _script_device(replace(options, script_args=args), plain.names_device, cuda=False) == "neuron"
    assert _script_device(replace(options, script_args=("--run-name", "neuron-test")), plain.names_device,
                          cuda=False) is None
    assert _script_device(replace(options, reference="neuron"), named.names_device, cuda=True) is None
    assert _script_device(replace(options, target="cpu:compile"), named.names_device, cuda=True) is None
    parse = {"reference": {"error": {"message": "RuntimeError: Expected one of cpu, cuda, ... device type at "
                                                "start of device string: neuron"}}}
    assert _script_device(options, _error_names(parse), cuda=_cuda_missing(parse)) == "neuron"
    driver = {"reference": {"error": {"message": "RuntimeError: Found no NVIDIA driver on your system."}}}
    assert _script_device(options, _error_names(driver), cuda=_cuda_missing(driver)) == "cuda"
    other = {"reference": {"error": {"message": "neuronal"}}}
    assert _script_device(options, _error_names(other), cuda=_cuda_missing(other)) is None


def test_cuda_on_the_target_is_its_own_device_while_the_script_runs(neuron):
    """A script written for CUDA, on the target: cuda names the target's device, torch.cuda answers for it, and
    everything is put back afterwards."""
    import torch

    from validate.named_device import script_device

    machine_has_cuda = torch.cuda.is_available()
    with script_device(torch, "cuda", neuron):
        assert torch.cuda.is_available() and torch.cuda.device_count() >= 1
        assert torch.cuda.get_device_capability() == (0, 0), "no CUDA capability to pick a path by"
        torch.cuda.manual_seed(0)
        torch.cuda.set_device(torch.device("cuda", 0))  # a cuda device given to torch.cuda: the target's
        layer = torch.nn.Linear(3, 2).cuda()
        x = torch.randn(4, 3, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)
        scaler = torch.amp.GradScaler("cuda")
        scaler.scale(out.float().sum()).backward()
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() >= 0
        # PyTorch's own code still sees the machine as it is: dynamo asked a CUDA it was told of for its
        # properties while compiling ("CUDA driver version is insufficient")
        compiled = torch.compile(torch.nn.Linear(3, 2).cuda(), backend="neuron")
        assert compiled(x).device.type == neuron.type
    assert layer.weight.device.type == x.device.type == neuron.type and out.dtype == torch.bfloat16
    assert scaler._device == neuron.type
    assert torch.cuda.is_available() == machine_has_cuda, "put back"


def test_a_cpu_side_has_no_accelerator_to_pin_for_and_takes_the_named_device_for_the_cpu():
    """In a fresh process, as a side runs: CUDA and the accelerator hidden, pinning a copy, and the target's
    name (with no backend behind it here) meaning the CPU for factories, moves, modules, autocast, the tensor
    method of its name and its device module (``torch.neuron.synchronize()``); so does cuda, for a script
    written for CUDA, whose CUDA branch it then takes."""
    import subprocess
    import sys

    code = """
import torch
from validate.named_device import script_device
from validate.training import _patch_accelerator_for_cpu
_patch_accelerator_for_cpu(torch)
x = torch.ones(3)
pinned = x.pin_memory()
assert pinned is not x and pinned.tolist() == [1.0, 1.0, 1.0] and not x.is_pinned()
assert not torch.cuda.is_available() and torch.accelerator.current_accelerator() == torch.device("cpu")
with script_device(torch, "neuron", "cpu"):
    device = torch.device("neuron")
    layer = torch.nn.Linear(4, 2, device="neuron").to(device)
    y = torch.randn(5, 4, device=device).to("neuron:0", non_blocking=True)
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        out = layer(y)
    assert layer.weight.device.type == "cpu" and y.device.type == "cpu" and out.dtype == torch.bfloat16
    torch.neuron.synchronize()
    assert torch.neuron.device_count() == 1 and torch.neuron.max_memory_allocated() == 0
    assert torch.neuron.memory_summary().startswith("memory of cpu")
    assert torch.ones(2).neuron().device.type == "cpu" and layer.neuron().weight.device.type == "cpu"
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    torch.neuron.current_stream().synchronize()
    end.record()
    assert start.elapsed_time(end) >= 0.0
    try:
        torch.neuron.get_device_properties(0)
    except AttributeError as exc:
        assert "no meaning on the CPU reference" in str(exc)
    else:
        raise AssertionError("the device's properties have no CPU meaning")
with script_device(torch, "cuda", "cpu"):
    assert torch.cuda.is_available(), "the script's CUDA branch, as on the target"
    torch.cuda.manual_seed(1)
    torch.cuda.synchronize()
    model = torch.nn.Linear(4, 2).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(torch.ones(1, 4).cuda(non_blocking=True))
    assert model.weight.device.type == "cpu" and out.dtype == torch.bfloat16
    assert torch.cuda.amp.GradScaler()._device == "cpu"
    free, total = torch.cuda.mem_get_info()  # what public scripts print about memory, and their profiler ranges
    assert 0 < free <= total and torch.cuda.max_memory_reserved() == 0 and "memory of cpu: 0.0 MiB" in torch.cuda.memory_summary()
    torch.cuda.reset_max_memory_allocated()  # older names, which call CUDA's own reset from inside torch.cuda
    torch.cuda.reset_max_memory_cached()
    assert torch.cuda.memory_cached() == 0 == torch.cuda.max_memory_cached()
    torch.cuda.nvtx.range_push("step")
    torch.cuda.nvtx.range_pop()
    with torch.cuda.nvtx.range("step"):
        pass
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    end.record()
    assert start.elapsed_time(end) >= 0.0
    untimed = torch.cuda.Event()
    untimed.record()
    try:
        start.elapsed_time(untimed)
    except ValueError as exc:
        assert "enable_timing=True" in str(exc)
    else:
        raise AssertionError("an event made without timing has no elapsed time, as on CUDA")
assert not torch.cuda.is_available()
print("ok")
"""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "NEURON_VALIDATE_EMULATOR_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_a_models_own_loss_is_the_only_place_the_backward_pass_starts():
    import torch

    from validate.training import _upstream_gradient

    loss_grad, logits_grad = torch.ones(()), torch.randn(2, 3)
    assert _upstream_gradient([loss_grad, logits_grad], [1, 6]) == [loss_grad, None]
    assert _upstream_gradient([None, logits_grad], [1, 6])[1] is logits_grad
    assert _upstream_gradient([None, None], [1, 6]) is None


# ---------------------------------------------------------------- randomness, bands, honest findings
def _curve(losses):
    return {"label": "x", "losses": losses, "step_seconds": [0.1] * len(losses)}


def test_a_band_side_that_never_ran_is_a_harness_finding_and_the_narrowest_band():
    """The FSDP2 flake: perturbed sides gave no curve. Never a silent fall back to the fixed 5% band: a 0.4%
    gap still fails, and the harness says what it could not run."""
    ref = [3.0 - 0.05 * i for i in range(20)]
    tgt = [x * 1.004 for x in ref]
    obs = {"reference": {"curve": _curve(ref)}, "target": {"curve": _curve(tgt)}, "perturbed_curves": [],
           "perturbed_expected": 2, "harness": ["side perturbed-0: it gave no loss curve (after a second try)"]}
    findings = run_checks(obs, CTX)
    (harness,) = [f for f in findings if f.check == "harness"]
    assert harness.severity == "warning" and "perturbed-0" in harness.title
    (curves,) = [f for f in findings if f.check == "loss-curves"]
    assert curves.severity == "error", "the narrowest band, not the fixed 5%"


def test_a_band_too_wide_to_see_a_five_percent_shift_is_not_informative():
    ref = [2.0] * 10
    wild = [[2.0 * (1 + 0.2 * ((i + k) % 3 - 1)) for i in range(10)] for k in range(2)]
    obs = {"reference": {"curve": _curve(ref)}, "target": {"curve": _curve([2.1] * 10)},
           "perturbed_curves": [_curve(w) for w in wild], "perturbed_expected": 2}
    (curves,) = [f for f in run_checks(obs, CTX) if f.check == "loss-curves"]
    assert curves.severity == "warning" and "not informative" in curves.title


def test_a_compiled_check_that_failed_is_never_called_a_match():
    """Before, the training convention's compiled check that failed to compile read "eager and compiled outputs
    match". Where the failed compile is the target's own failure (the functions convention), the runs check
    says so and numerics adds nothing."""
    from validate.checks import check_numerics

    loc = {"ok": True, "outputs": {"leaves": 1}, "gradients": {"leaves": 2}, "layers": []}
    obs = {"localization": loc, "compiled": {"error": {"message": "BackendCompilerFailed: boom"}}, "target": {}}
    findings = check_numerics(obs, CTX)
    assert [(f.severity, f.subject) for f in findings] == [("warning", "compiled"), ("info", "")], findings
    assert "boom" in findings[0].title and "eager and compiled" not in findings[1].title
    obs["target"] = {"error": {"message": "BackendCompilerFailed: boom"}}
    assert [f.severity for f in check_numerics(obs, CTX)] == ["info"]


def test_a_step_over_several_backward_passes_says_why():
    """Gradient accumulation, or a GAN's two optimizers taking turns (DCGAN: 3 backward passes a round, one
    step of each optimizer), which is not accumulation."""
    ref = [2.0 - 0.1 * i for i in range(10)]
    obs = {"reference": {"curve": _curve(ref)}, "target": {"curve": _curve(ref),
                                                           "steps": {"optimizer": 10, "backward": 40, "optimizers": 1}}}
    (curves,) = [f for f in run_checks(obs, CTX) if f.check == "loss-curves"]
    assert "10 steps over 40 backward passes (gradient accumulation)" in curves.title
    obs["target"]["steps"] = {"optimizer": 10, "backward": 15, "optimizers": 2}
    (curves,) = [f for f in run_checks(obs, CTX) if f.check == "loss-curves"]
    assert "10 steps over 15 backward passes (2 optimizers taking turns)" in curves.title


def test_the_devices_own_stream_findings():
    ref = [2.0 - 0.01 * i for i in range(10)]
    streams = [_curve([x * (1 + 0.002 * ((i + k) % 2)) for i, x in enumerate(ref)]) for k in range(3)]
    base = {"reference": {"curve": _curve(ref)}, "target": {"curve": _curve(ref)}}
    ok = {**base, "own_stream": {"target": _curve(ref), "streams": streams, "draw_differences": []}}
    assert [f.severity for f in run_checks(ok, CTX) if f.check == "random-stream"] == ["info"]
    off = {**base, "own_stream": {"target": _curve([x * 1.2 for x in ref]), "streams": streams,
                                  "draw_differences": ["aten::randn_like: the target's draws have variance 4"]}}
    bad = [f for f in run_checks(off, CTX) if f.check == "random-stream"]
    assert [f.severity for f in bad] == ["error", "error"] and "another distribution" in bad[0].title


def test_parting_draws_are_named():
    obs = {"reference": {"curve": _curve([1.0, 0.9])}, "target": {"curve": _curve([1.0, 0.9])},
           "draws": {"on_device": 3, "parting": "random draw 2: the reference drew aten::rand [3] at s.py:4; "
                                                "the target drew aten::randn [3] at s.py:6"}}
    (parting,) = [f for f in run_checks(obs, CTX) if f.check == "randomness"]
    assert parting.severity == "warning" and "random draw 2" in parting.title


def test_eager_runs_say_nothing_of_compiled_narrowing_and_a_script_compile_is_named():
    import dataclasses

    eager = dataclasses.replace(CTX, mode="eager")
    obs = {"target": {"wide_tensors": [{"name": "idx", "shape": [4], "dtype": "int64", "fits": True}]}}
    assert not [f for f in run_checks(obs, eager) if f.check == "wide-dtypes"]
    obs["target"]["script_compiles"] = ["train.py:263"]
    found = {f.check: f for f in run_checks(obs, eager)}
    assert "wide-dtypes" in found and "train.py:263" in found["compile"].title


def test_accelerate_choosing_the_cpu_is_named_with_its_version():
    obs = {"target": {"ran": True, "executed_ops": 0, "accelerate": {"version": "1.2.3", "device": "cpu"}}}
    (unused,) = [f for f in run_checks(obs, CTX) if f.check == "target-used"]
    assert "accelerate 1.2.3" in unused.detail and "torch.accelerator" in unused.hint


def test_a_sides_outputs_are_its_own_writes_not_a_busy_parent_folders(tmp_path, monkeypatch):
    """The working directory's parent is a busy folder (the temporary one, where a checkout may live): another
    process appends to a log there, and a library makes its scratch files there with tempfile. Neither is the
    script's output; the file the script itself rewrites through ``..`` is, written apart, and one C code
    rewrites in the working directory is reported (seen by its stamp)."""
    import subprocess
    import sys
    import tempfile

    from validate.workdir import own_working_directory

    parent = tmp_path / "busy"
    project = parent / "project"
    project.mkdir(parents=True)
    (parent / "other-job.log").write_text("started\n")
    (parent / "out.txt").write_text("the last run's")  # existed before: the side writes through its link
    (project / "weights.bin").write_bytes(b"old")
    monkeypatch.chdir(project)
    with own_working_directory(str(tmp_path / "side")) as files:
        subprocess.run([sys.executable, "-c", f"open({str(parent / 'other-job.log')!r}, 'a').write('more\\n')"],
                       check=True)
        fd, scratch = tempfile.mkstemp(dir=parent)
        with open(fd, "w") as f:
            f.write("a compiler's scratch")
        folder = tempfile.mkdtemp(dir=parent)
        with open(f"{folder}/kernel.cpp", "w") as f:
            f.write("//")
        with open("../out.txt", "w") as f:
            f.write("the script's output")
        subprocess.run([sys.executable, "-c", "open('weights.bin', 'wb').write(b'new, longer')"], check=True)
        # tempfile's first use probes the temporary folder: a file of 8 random letters, written and removed
        # with os.open, no tempfile event (seen as "the target side wrote ../7g2lj10j" under compile).
        monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(parent)])
        monkeypatch.setattr(tempfile, "tempdir", None)
        assert tempfile.gettempdir() == str(parent)
    # The script's own rewrite through ``..`` lands apart (validate.workdir._write_apart), and the file it
    # existed as is left as it was; C code in another process writes through the link, and is reported.
    assert files["shared"] == ["weights.bin"], files["shared"]
    assert "../out.txt" in files["created"] and (parent / "out.txt").read_text() == "the last run's"


def test_a_sides_working_directory_is_mirrored_afresh_for_every_run(tmp_path, monkeypatch):
    """Run again with the same ``--out`` after adding the data the first run lacked: the second run sees the
    data, not the empty folders the first run's download attempt made (pytorch/examples' mnist_forward_forward:
    "Error downloading train-images-idx3-ubyte.gz" though ./data/MNIST/raw was there)."""
    from validate.workdir import own_working_directory

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    with own_working_directory(str(tmp_path / "side")) as files:
        os.makedirs("data/MNIST/raw")  # the script's failed download leaves its folders behind
    assert not (project / "data").exists()
    (project / "data" / "MNIST" / "raw").mkdir(parents=True)
    (project / "data" / "MNIST" / "raw" / "train-images").write_text("the user's data")
    (project / "kept.txt").write_text("the user's")
    with own_working_directory(str(tmp_path / "side")) as files:
        assert open("data/MNIST/raw/train-images").read() == "the user's data"
    assert (project / "kept.txt").read_text() == "the user's", "the user's files are never removed"
    assert files["created"] == [] and files["shared"] == []


def test_modules_held_in_a_plain_list_are_named_as_what_to_did_not_move():
    """A model that keeps layers in a plain list (transformers' OneFormer does) runs on no accelerator: the scan
    names them, and a mixed-device error points at their weights."""
    import torch

    from validate.probes import placement_scan

    class Stranded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = [torch.nn.Conv2d(2, 2, 1) for _ in range(2)]

    scan = placement_scan(Stranded(), "neuron")
    assert scan["unregistered_modules"] == ["proj (2 Conv2d)"]
    obs = {"placement_events": [{"kind": "mixed", "op": "aten::convolution", "source": None, "module": "", "count": 1}],
           "target": {"placement": scan}}
    findings = {f.subject: f for f in check_placement(obs, CTX)}
    assert "nn.ModuleList" in findings["unregistered_modules"].hint
    mixed = next(f for s, f in findings.items() if s.startswith("mixed"))
    assert "the weights of proj (2 Conv2d)" in mixed.hint, mixed.hint


def test_a_packed_sequences_lengths_and_indices_on_the_cpu_are_not_a_placement_error(neuron):
    """``pack_padded_sequence`` takes its lengths on the CPU on every device (CUDA's too), an LSTM its packed
    batch sizes, and advanced indexing CPU indices (ATen moves them): an LSTM classifier over packed sequences
    was NOT READY ("_pack_padded_sequence mixes a CPU tensor with neuron tensors"). A weight left on the CPU
    beside device tensors is still one."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from diff.localize.tracer import OpTracer
    from validate.probes import placement_from_trace

    lstm = torch.nn.LSTM(4, 8, batch_first=True).to(neuron)
    x, lengths = torch.randn(3, 5, 4, device=neuron), torch.tensor([5, 2, 3])
    with OpTracer() as tracer:
        out, _ = lstm(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        pad_packed_sequence(out, batch_first=True)
        x[torch.tensor([0, 2])], x[torch.tensor([True, False, True])]  # CPU indices: ATen moves them
        x[torch.tensor([1]), 0] = torch.zeros(1, 4, device=neuron)
        x[:, 0] @ torch.randn(4, 2)  # a real mix: a CPU matrix beside a device one
    mixed = [e["op"] for e in placement_from_trace(tracer.events, "neuron") if e["kind"] == "mixed"]
    assert mixed == ["aten::mm"], mixed


def test_weights_within_rounding_are_the_same_start_and_unrelated_ones_are_not():
    """Where the model's first call comes after training (a torch.func loop), the two devices' weights differ
    in the last bits: the exact hashes differ, the sketches agree. Another seed, or another batch of MNIST-like
    images (the same background, other digits), is another start."""
    import torch

    from validate.probes import sketch

    torch.manual_seed(0)
    weights = torch.randn(64, 20)
    images = torch.full((64, 784), -0.42)
    images[:, 300:460] = torch.rand(64, 160) * 2.8
    others = images.clone()
    others[:, 300:460] = torch.rand(64, 160) * 2.8
    curve = {"label": "x", "losses": [1.0, 0.9], "step_seconds": [0.1, 0.1]}

    def start_findings(ref: torch.Tensor, tgt: torch.Tensor) -> list:
        fp = lambda t: {"parameters": str(hash(t.numpy().tobytes())), "inputs": "b",  # noqa: E731
                        "parameters_sketch": [sketch(t)]}
        obs = {"reference": {"curve": curve, "fingerprints": fp(ref)}, "target": {"curve": curve, "fingerprints": fp(tgt)}}
        return [f for f in run_checks(obs, CTX) if f.check == "same-start"]

    assert not start_findings(weights, weights * (1 + 1e-5 * torch.randn_like(weights)))
    assert start_findings(weights, torch.randn(64, 20))
    assert start_findings(images, others)


@pytest.mark.parametrize("message, words", [
    ("RuntimeError: Internal error: NestedTensorImpl doesn't support strides. Please file an issue.",
     "enable_nested_tensor=False"),
    ("NotImplementedError: Cannot access storage of SparseTensorImpl", "sparse=False")])
def test_a_target_without_nested_or_sparse_tensors_is_told_what_to_change(message, words):
    obs = {"target": {"error": {"message": message, "phase": "step 7"}}, "reference": {"ran": True}}
    (runs,) = [f for f in run_checks(obs, CTX) if f.check == "runs"]
    assert runs.severity == "error" and words in runs.hint, runs.hint


def test_hashing_the_models_weights_leaves_them_as_the_script_had_them():
    """On the CPU reference the model's tensors are the hashed ones themselves: NumPy's view of a storage marks
    it not resizable, and a QAT observer's ``resize_`` of its own buffer then failed in the script ("Trying to
    resize storage that is not resizable": exit 2, the script blamed). The hash is taken from a copy."""
    import torch

    from validate.probes import fingerprint

    scale, weight = torch.ones(1), torch.randn(4, 3).t()  # a buffer an observer resizes; a view
    before = fingerprint([scale, weight])
    scale.resize_(8)
    assert fingerprint([torch.ones(1), weight.contiguous()]) == before


def test_why_gradients_are_not_compared_is_said_in_the_scripts_terms():
    """An ensembling or inference script called its model with gradients on and never called backward()
    (PyTorch's ensembling tutorial): that is said as it is, not as a backward() that stopped early."""
    from types import SimpleNamespace

    from validate.training import _why_no_gradients

    called = dict(captured=True, root_type="SimpleMLP", calls=[SimpleNamespace(grad_output=[None])])
    assert _why_no_gradients(SimpleNamespace(**called, backward_calls=0)) == (
        "the script calls no backward(), so there are no gradients to compare")
    assert "stopped before it" in _why_no_gradients(SimpleNamespace(**called, backward_calls=3))
    assert "only called without gradients" in _why_no_gradients(
        SimpleNamespace(captured=False, root_type="SimpleMLP", calls=[], backward_calls=0))


def test_a_script_run_as_main_sees_its_copy_as_file_and_leaves_a_process_without_main_as_it_was(tmp_path):
    """run_as_main runs the user's code under the user's path (tracebacks name it) with ``__file__`` naming the
    copy in the side's folder; a process that had no ``__main__`` module has none afterwards either."""
    import sys

    from validate.training import run_as_main

    script = tmp_path / "train.py"
    script.write_text("import sys\nseen = (__file__, __name__, sys.modules['__main__'].__dict__ is globals())\n"
                      "sys.modules['seen_by_test'] = seen\n")
    copy = tmp_path / "mirror" / "train.py"
    saved = sys.modules.pop("__main__", None)
    try:
        run_as_main(str(script), str(copy))
        assert "__main__" not in sys.modules
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved
    assert sys.modules.pop("seen_by_test") == (str(copy), "__main__", True)


def test_eval_mode_outputs_that_the_devices_rounding_moves_as_far_are_inconclusive_not_an_error():
    """A detector's eval outputs (boxes kept by score and non-maximum suppression) moved 0.35 when the reference
    rounded as the default profile's device may: torchvision's Faster R-CNN was NOT READY on a correct device
    until the reference's own spread was asked. Beyond it, or with no precision model, a difference is an error;
    different shapes (a box more or less) are a warning."""
    from validate.checks import check_eval_mode

    mismatch = {"ok": False, "leaves": 1, "mismatches": [{"path": "output[0]", "message": "12.5% differ"}]}
    seen = {"outputs": mismatch, "shapes_differ": False, "target_rel_error": 0.7, "reference_rel_error": 0.35}
    (found,) = check_eval_mode({"eval_mode": seen}, CTX)
    assert (found.severity, found.subject) == ("info", "inconclusive"), found
    seen["reference_rel_error"] = 0.01
    (found,) = check_eval_mode({"eval_mode": seen}, CTX)
    assert found.severity == "error" and "outputs differ" in found.title, found
    (found,) = check_eval_mode({"eval_mode": {"outputs": mismatch, "shapes_differ": False}}, CTX)
    assert found.severity == "error", found
    (found,) = check_eval_mode({"eval_mode": {"outputs": mismatch, "shapes_differ": True}}, CTX)
    assert (found.severity, found.subject) == ("warning", "shapes"), found
    (found,) = check_eval_mode({"eval_mode": {"reference_error": {"message": "boom"}}}, CTX)
    assert found.severity == "info" and "fails on the reference" in found.title, found
    assert check_eval_mode({}, CTX) == []
