"""Sound verdicts: faults in dropout models, scripts that never use the device, gradients of eval-first scripts,
host execution the backend does not report, and the rough edges of real scripts.

Each test runs the installed ``neuron-validate`` on a real script with, where it says so, a real fault
injected into the emulated device or a real backend module; nothing tells the harness about either.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.conftest import REPO, run_cli
from tests.validate.conftest import example

SCRIPTS = os.path.join(REPO, "tests", "validate", "scripts")
FAULT = {"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.01"}


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def _ready_and_a_fault_named(validate, name: str, fault: str, op: str):
    """``name`` is READY on a clean device (profile ``exact``) and NOT READY with ``fault``, named at ``op``;
    returns the clean run."""
    clean = validate(script(name), "--emulator-profile", "exact")
    assert clean.report["verdict"] == "ready", clean.stdout
    faulty = validate(script(name), "--emulator-profile", "exact", env={"NEURON_VALIDATE_FAULTS": fault})
    assert faulty.report["verdict"] == "not ready", faulty.stdout
    (numerics,) = faulty.findings("numerics", "error")
    assert numerics["data"]["op"] == op, numerics
    return clean


def test_dropout_model_with_a_one_percent_fault_is_not_ready_and_named(validate):
    run = validate(example("dropout_classifier.py"), env=FAULT)
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["culprit"] == "0" and numerics["data"]["op"] == "aten::addmm"


def test_dropout_model_without_a_fault_is_ready(validate):
    run = validate(example("dropout_classifier.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout


def test_a_script_that_ignores_the_device_is_not_ready(validate):
    run = validate(script("forgets_device.py"))
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    (unused,) = run.findings("target-used", "error")
    assert "never used the target device" in unused["title"] and ".to(device)" in unused["hint"]


def test_eval_first_script_has_its_gradients_compared(validate):
    run = validate(example("eval_first_gpt.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    (numerics,) = run.findings("numerics", "info")
    assert "gradients (0)" not in numerics["title"], numerics["title"]
    assert run.report["numerics"]["gradients"]["leaves"] > 0


def test_eval_first_backward_fault_is_found(validate):
    run = validate(example("eval_first_gpt.py"), "--emulator-profile", "exact",
                   env={"NEURON_VALIDATE_FAULTS": "perturb@aten::mm,rel=0.01,phase=backward"})
    assert run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["phase"] == "backward"


def test_faults_the_layer_comparison_cannot_see_fail_the_curves_of_a_device_that_computes_like_the_cpu(validate):
    """The layer comparison runs the model's first call; the loss computed outside the model and the optimizer's
    update show in the loss curves alone. For a device that computes like the CPU (``exact``) their band was
    the fixed 5%, and a 2% fault in Adam's update (a loss gap of 2.9%) passed as READY. Their band is now
    float32 rounding's, from perturbed reference runs, needed only where the curves are not equal."""
    clean = validate(example("vae.py"), "--emulator-profile", "exact", "--steps", "10")
    assert clean.report["verdict"] == "ready", clean.stdout
    assert clean.report["curves"]["max_abs_gap"] == 0 and clean.report["curves"]["perturbed_runs"] == 0
    for fault in ("perturb@aten::_foreach_addcdiv*,rel=0.02", "perturb@aten::binary_cross_entropy,rel=0.02"):
        run = validate(example("vae.py"), "--emulator-profile", "exact", "--steps", "10",
                       env={"NEURON_VALIDATE_FAULTS": fault})
        assert run.report["verdict"] == "not ready", (fault, run.stdout)
        assert run.findings("numerics", "info"), run.stdout  # the model's own layers agree
        (curves,) = run.findings("loss-curves", "error")
        assert run.report["curves"]["perturbed_runs"] == 2 and run.report["curves"]["max_rel_gap"] < 0.05, curves


def test_a_fault_in_a_kernel_only_eval_mode_runs_is_not_ready(validate):
    """In eval mode without gradients PyTorch runs each nn.TransformerEncoderLayer as one fused kernel, on the
    PrivateUse1 device too; training runs it op by op. The script trains and never evaluates, so a 2% fault in
    the fused kernel was READY (layers, gradients and curves all agree). The model is now also called in eval
    mode without hooks (PyTorch takes the fused path only where none is attached)."""
    clean = validate(script("encoder_classifier.py"), "--emulator-profile", "exact")
    assert clean.report["verdict"] == "ready", clean.stdout
    (matched,) = clean.findings("eval-mode", "info")
    assert "match the reference too" in matched["title"], matched
    faulty = validate(script("encoder_classifier.py"), "--emulator-profile", "exact",
                      env={"NEURON_VALIDATE_FAULTS": "perturb@aten::_transformer_encoder_layer_fwd,rel=0.02"})
    assert faulty.report["verdict"] == "not ready", faulty.stdout
    assert faulty.findings("numerics", "info"), faulty.stdout  # training mode agrees
    (differ,) = faulty.findings("eval-mode", "error")
    assert differ["data"]["op"] == "aten::_transformer_encoder_layer_fwd", differ


def test_compile_mode_compares_compiled_outputs_and_names_train_eval_switches(validate):
    run = validate(example("dropout_classifier.py"), "--mode", "compile")
    assert run.report["verdict"] == "ready", run.stdout
    assert run.report["compiled"] and run.report["compiled"]["outputs"]["ok"]
    assert run.findings("numerics", "info")[0]["title"].startswith("eager and compiled")


def test_compile_only_fault_in_a_training_script_is_found(validate):
    run = validate(example("dropout_classifier.py"), "--mode", "compile", "--emulator-profile", "exact",
                   env={"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.01,mode=compile"})
    assert run.report["verdict"] == "not ready", run.stdout
    assert run.findings("numerics", "error")[0]["subject"] == "compiled"


def test_a_script_that_compiles_its_own_model_has_its_compiled_outputs_judged(validate):
    """An eager target still trains such a model compiled, with its own backend: the compiled outputs are
    judged, not only the loss curves (a compile-only fault 1% off in every matmul moved nanoGPT's loss by 0.01%
    in 10 steps and was READY). The clean run trains attention with dropout compiled, which the emulated
    compiler failed on while the harness's draws set inductor's fallback_random."""
    args = (script("attention_training.py"), "--emulator-profile", "exact", "--", "--compile", "--dropout", "0.1")
    clean = validate(*args)
    assert clean.returncode == 0 and clean.report["verdict"] == "ready", clean.stdout
    assert clean.report["compiled"]["outputs"]["ok"] and "eager and compiled outputs" in clean.stdout
    faulty = validate(*args, env={"NEURON_VALIDATE_FAULTS": "perturb@aten::mm,rel=0.01,mode=compile"})
    assert faulty.report["verdict"] == "not ready", faulty.stdout
    assert faulty.findings("numerics", "error")[0]["subject"] == "compiled"


def test_loader_workers_start_as_under_python_so_a_script_without_a_main_guard_runs(validate):
    """Sides descend from spawned processes, which made ``spawn`` multiprocessing's default there: DataLoader
    workers ran the script's top level again, and this script failed on the reference ("DataLoader worker
    exited unexpectedly"); pytorch/examples' MNIST (guarded) took 15 s on the target instead of 3 s."""
    run = validate(script("loader_workers.py"), "--emulator-profile", "exact")
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert run.report["curves"]["steps"] == 8


def test_data_that_depends_on_the_device_is_diagnosed_as_data(validate):
    run = validate(script("shuffles_with_accelerator.py"), "--emulator-profile", "exact")
    (start,) = run.findings("same-start", "warning")
    assert start["subject"] == "data" and "data order" in start["title"]
    assert "DataLoader options set only for an accelerator" in start["hint"]


def test_host_execution_the_backend_does_not_report_is_a_host_fallback(validate):
    run = validate(script("uses_sin.py"), "--emulator-profile", "exact", "--backend-module", "tests.fixtures.host_ops",
                   env={"PYTHONPATH": REPO})
    fallback = {f["subject"]: f for f in run.findings("host-fallback", "warning")}
    assert "aten::sin" in fallback, run.stdout
    assert "did not report it" in fallback["aten::sin"]["detail"]
    clean = validate(script("uses_sin.py"), "--emulator-profile", "exact")
    assert not clean.findings("host-fallback"), "the device's own sin is not host execution"


def test_a_script_that_names_the_neuron_device_is_checked_against_the_cpu(validate):
    """``torch.device("neuron")``, ``.to("neuron")``, ``autocast("neuron")``: the script as moved to Trainium,
    unchanged. The CPU reference takes the name for the CPU (before: exit 2, "the script fails on the
    reference (cpu): ... device string: neuron"); its bfloat16 loss (``log_softmax`` in bfloat16 on the device,
    float32 on the CPU) is within the band; a 5% matmul fault (in bfloat16, whose own tolerance is 1.6%) is
    still found at its layer."""
    run = validate(script("names_neuron.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout + run.stderr
    assert any("names the neuron device itself" in note for note in run.report["notes"])
    assert run.findings("numerics", "info") and run.findings("loss-curves", "info")
    (speed,) = run.findings("speed", "info")
    assert "the reference ran with the script's neuron translated call by call" in speed["title"]
    faulty = validate(script("names_neuron.py"), "--emulator-profile", "exact",
                      env={"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.05"})
    assert faulty.returncode == 1 and faulty.report["verdict"] == "not ready", faulty.stdout + faulty.stderr
    (numerics,) = faulty.findings("numerics", "error")
    assert "first diverging layer embed (Linear), op aten::addmm" in numerics["title"], numerics


def test_every_side_has_the_model_library_the_script_imports_before_the_script_runs(validate):
    # Imported once in each side's zygote, not in each of the check's sides (seconds each for transformers).
    run = validate(script("imports_torchvision.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    printed = {folder.name: (folder / "stdout.txt").read_text() for folder in Path(run.out, "work").iterdir()
               if (folder / "stdout.txt").exists()}
    assert {"reference", "target"} <= set(printed) and len(printed) >= 4, printed  # the band's sides too
    assert all("imported before the script: True" in text for text in printed.values()), printed


def test_the_functions_convention_imports_torch_neuronx_where_the_emulated_device_stands_in(validate):
    run = validate(script("imports_torch_neuronx.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout + run.stderr
    assert run.findings("numerics", "info")


def test_a_device_named_where_no_scan_sees_it_is_taken_for_the_cpu_after_the_reference_fails(validate):
    """The device comes from the project's settings module: the first reference run fails on the name, and the
    check runs again with the name taken for the CPU, rather than stopping with exit 2."""
    run = validate(script(os.path.join("device_from_helper", "train.py")))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout + run.stderr
    assert any("names the neuron device itself" in note for note in run.report["notes"])


def test_a_script_written_for_cuda_is_checked_with_cuda_taken_for_the_target(validate):
    """``"cuda" if torch.cuda.is_available() else "cpu"``, ``.cuda()``, float16 autocast for "cuda" with the
    deprecated ``torch.cuda.amp.GradScaler``, ``torch.cuda.synchronize()``: as written it trains on the CPU
    anywhere but on CUDA (before: NOT READY, "the script never used the target device"). Every side takes
    its cuda for its own device: the numerics are judged, and a warning names the one change to make. A 5%
    matmul fault is found at its layer."""
    run = validate(script("written_for_cuda.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready with warnings", run.stdout + run.stderr
    (choice,) = run.findings("device-choice", "warning")
    assert "written for CUDA" in choice["title"] and "torch.accelerator.current_accelerator()" in choice["hint"]
    assert [f["check"] for f in run.findings(severity="warning")] == ["device-choice"]
    assert run.findings("numerics", "info") and run.findings("loss-curves", "info")
    (speed,) = run.findings("speed", "info")
    assert "both sides ran with the script's cuda translated" in speed["title"]
    faulty = validate(script("written_for_cuda.py"), "--emulator-profile", "exact",
                      env={"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.05"})
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr
    (numerics,) = faulty.findings("numerics", "error")
    assert "first diverging layer fc (Linear), op aten::addmm" in numerics["title"], numerics


def test_a_script_hard_wired_to_cuda_is_run_again_with_cuda_taken_for_the_target(validate):
    """``device = "cuda"`` with nothing to choose: the reference fails for want of CUDA ("Found no NVIDIA
    driver"), and the check runs again with cuda taken for each side's device (before: exit 2)."""
    run = validate(script("hardwired_cuda.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready with warnings", run.stdout + run.stderr
    assert run.findings("device-choice", "warning") and run.findings("numerics", "info")


def test_script_options_without_double_dash_suggest_it(tmp_path):
    result = run_cli("neuron-validate", script("writes_outputs.py"), "--epochs", "1")
    assert result.returncode == 2
    assert "options for the script go after --" in result.stderr and "-- --epochs 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_sides_write_their_outputs_apart_and_shared_files_are_reported(tmp_path):
    """New files and files the script rewrites (``torch.save`` over an existing one) land in each side's own
    folder, and the user's are left as they were; a file a process the script starts writes goes through
    to the user's folder, and is reported."""
    work = tmp_path / "work"
    work.mkdir()
    import torch

    torch.save(torch.randn(8, 4), work / "inputs.pt")
    torch.save({}, work / "existing.pt")
    (work / "notes.txt").write_text("the user's notes\n")
    before = (work / "existing.pt").read_bytes()
    shutil.copy(script("writes_outputs.py"), work / "train.py")
    result = run_cli("neuron-validate", "train.py", "--json", cwd=str(work))
    import json

    report = json.loads(result.stdout)
    outputs = {f["subject"]: f for f in report["findings"] if f["check"] == "outputs"}
    assert "notes.txt" in outputs["shared"]["title"] and outputs["shared"]["severity"] == "warning"
    assert "inputs.pt" not in outputs["shared"]["title"], "read, not written"
    assert "existing.pt" not in outputs["shared"]["title"], "written apart"
    assert "model.pt" in outputs["created"]["title"] and "existing.pt" in outputs["created"]["title"]
    assert not (work / "model.pt").exists(), "each side's new files stay in its own folder"
    assert (work / "existing.pt").read_bytes() == before, "the user's file is left as it was"


def test_the_harness_own_fault_logs_are_not_the_scripts_outputs_when_run_in_the_temporary_folder(tmp_path):
    """Run from the temporary folder itself (as a script in /tmp is): the supervisor's fault-handler logs land
    beside the script, and were reported as "the target side wrote neuron-validate-faults-.../worker-N.log
    in your working directory"."""
    shutil.copy(script("autocast_step.py"), tmp_path / "train.py")
    result = run_cli("neuron-validate", "train.py", "--json", "--steps", "2", cwd=str(tmp_path),
                     env={"TMPDIR": str(tmp_path)})
    import json

    report = json.loads(result.stdout)
    assert not [f for f in report["findings"] if f["check"] == "outputs"], report["findings"]
    assert report["verdict"] == "ready"


def test_the_layer_comparison_runs_under_the_scripts_autocast(validate):
    """A fault only in bfloat16 matmuls (5%: beyond bfloat16's tolerance) shows only if the comparison runs the
    call as the script did."""
    clean = validate(script("autocast_step.py"), "--emulator-profile", "exact")
    assert clean.report["verdict"] == "ready", clean.stdout
    assert any("autocast (bfloat16)" in note for note in clean.report["notes"])
    run = validate(script("autocast_step.py"), "--emulator-profile", "exact",
                   env={"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.05,dtype=bfloat16"})
    assert run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["op"] == "aten::addmm"


def test_the_loss_curve_is_the_loss_not_the_loss_a_grad_scaler_scaled(validate):
    """Mixed-precision scripts call ``scaler.scale(loss).backward()``: the curve is the loss itself (the scale
    grows and backs off on its own schedule, and a step the target's scaler skipped would halve it)."""
    plain = validate(script("autocast_step.py"), "--emulator-profile", "exact")
    scaled = validate(script("autocast_step.py"), "--emulator-profile", "exact", "--", "--scaler")
    assert scaled.report["verdict"] == "ready", scaled.stdout
    for side in ("reference", "target"):
        assert scaled.report["curves"][side]["losses"] == plain.report["curves"][side]["losses"], side


def test_a_parametrized_layers_weight_computation_is_not_taken_for_the_model(validate):
    """spectral_norm computes its weight by calling a ParametrizationList (holding ``original``) while the
    layer is built on the CPU: that call was taken for the model, its parameters reported as left on the CPU
    and the model's gradients never compared."""
    run = validate(script("parametrized_layers.py"), "--emulator-profile", "exact")
    assert run.report["verdict"] == "ready", run.stdout
    assert not run.findings("placement", "warning")
    (numerics,) = run.findings("numerics", "info")
    assert "gradients (7)" in numerics["title"], numerics["title"]


def test_a_model_in_data_parallel_has_its_layers_compared_and_a_fault_is_named(validate):
    """nn.DataParallel on the device, copied to the CPU reference, refused to run ("module must have its
    parameters and buffers on device neuron:0 (device_ids[0])"): the layers were never compared."""
    clean = _ready_and_a_fault_named(validate, "data_parallel.py", "perturb@aten::addmm,rel=0.02", "aten::addmm")
    assert "gradients (4)" in clean.findings("numerics", "info")[0]["title"]


def test_pruned_layers_and_user_autograd_have_their_layers_compared_and_a_fault_is_named(validate):
    """Pruning's ``weight`` (``weight_orig * weight_mask``, a tensor with a history) made ``deepcopy`` refuse
    the model: the layers were never compared, and with no finding saying so a 2% device tanh fault inside a
    custom op was READY on curves 0.26% apart."""
    clean = _ready_and_a_fault_named(validate, "pruned_custom_ops.py", "perturb@aten::tanh,rel=0.02",
                                     "nvtest::scaled_tanh")
    assert "gradients (6)" in clean.findings("numerics", "info")[0]["title"]


def test_a_model_that_cannot_be_copied_is_a_warning_not_silence(validate):
    run = validate(script("uncopyable_model.py"), "--emulator-profile", "exact")
    assert run.report["verdict"] == "ready with warnings", run.stdout
    (numerics,) = run.findings("numerics")
    assert numerics["severity"] == "warning" and "the model cannot be copied" in numerics["title"], numerics
    assert "__deepcopy__" in numerics["hint"]


def test_a_torch_func_training_loop_is_checked_and_starts_from_the_same_weights(validate):
    """vmap(grad(functional_call(model, ...))) hands the model functorch's wrappers, which have no storage:
    the capture failed the reference ("Cannot access data pointer of Tensor that doesn't have storage", exit
    2). The model's first call outside a transform comes after training, and its weights, computed on each
    device, differ in the last bits: no longer "different weights"."""
    run = validate(script("func_training.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout + run.stderr
    assert not run.findings("same-start")
    assert run.findings("numerics", "info")


def test_an_optimizer_closure_step_records_what_step_returns(validate):
    """L-BFGS calls backward() inside step(closure), as often as its line search needs: a step's loss is the
    closure's first, which step(closure) returns, not the mean of the line search's trial points."""
    run = validate(script("lbfgs_fit.py"), "--emulator-profile", "exact")
    assert run.report["verdict"] in ("ready", "ready with warnings"), run.stdout
    printed = [float(line.rsplit(" ", 1)[1]) for line in
               open(os.path.join(run.out, "work", "reference", "stdout.txt")).read().splitlines()
               if line.startswith("step(closure) returned")]
    assert len(printed) == 4 and run.report["curves"]["reference"]["losses"] == printed, printed
    assert "the optimizer's closure" in run.findings("loss-curves")[0]["title"]


def test_a_target_that_fails_after_a_draw_is_a_failure_not_a_random_stream_difference(validate):
    """The target fails in its first backward pass (its loss is on the curve), the reference draws on: "the
    sides ask for different random numbers ... the target drew nothing more" was a second, false finding."""
    run = validate(script("pruned_custom_ops.py"), "--emulator-profile", "exact",
                   env={"NEURON_VALIDATE_FAULTS": "raise@aten::tanh,phase=backward"})
    assert run.report["verdict"] == "not ready", run.stdout
    assert run.findings("runs", "error")
    assert not run.findings("randomness"), run.findings("randomness")


def test_a_generate_loop_has_its_first_call_compared_with_its_own_cache_and_a_fault_is_named(validate):
    """generate() hands the model a DynamicCache that it fills as it goes: kept by reference, the compared
    call's cache held the whole generation, on the target's device, and the reference's attention refused it
    ("Expected query, key, and value to have the same device type"): layers not compared, and a 2% tanh fault
    in GPT-2's GELU was READY WITH WARNINGS."""
    _ready_and_a_fault_named(validate, "generates_text.py", "perturb@aten::tanh,rel=0.02", "aten::tanh")


def test_a_torchscript_model_runs_on_the_target_and_its_uncompared_layers_are_a_warning(validate):
    """The placement scan iterated a ScriptModule's parameter table, which TorchScript cannot iterate:
    "fails on the target: TypeError: contains(): incompatible function arguments", a false NOT READY. Its
    layers are still not compared (TorchScript refuses hooks): a warning, not silence."""
    run = validate(script("scripted_model.py"), "--emulator-profile", "exact")
    assert run.returncode == 0 and not run.findings("runs", "error"), run.stdout
    assert run.report["verdict"] == "ready with warnings"
    assert run.findings("numerics", "warning")[0]["title"].startswith("layers not compared")


def test_a_quantization_aware_model_whose_observers_resize_their_buffers_is_ready(validate):
    """The reference side hashed the model's weights (the same-start check) through NumPy, which marks a CPU
    storage not resizable: the observers' ``resize_`` then failed in the script on the CPU reference, exit 2
    with "the script fails on the reference" for a script that runs under ``python``. A fault in its first
    layer is named."""
    _ready_and_a_fault_named(validate, "qat_observers.py", "perturb@aten::addmm,rel=0.02", "aten::addmm")


def test_a_script_that_ends_with_os_exit_is_checked(validate):
    """``os._exit(0)`` after training killed the side's process before it reported: "the script's process died
    on the reference" (exit 2) for a script that had trained. It ends the script as ``sys.exit`` would; a
    status other than 0 is still the script's failure."""
    run = validate(script("exits_hard.py"), "--emulator-profile", "exact")
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout + run.stderr
    assert run.report["curves"]["steps"] == 6
    failed = validate(script("exits_hard.py"), "--emulator-profile", "exact", env={"EXIT_STATUS": "3"})
    assert failed.returncode == 2 and "exited with status 3" in failed.stderr, failed.stderr


def test_every_top_level_module_the_first_step_trains_is_compared_and_a_fault_in_a_later_one_is_named(validate):
    """An embedding, an encoder and a head held apart, as many scripts hold a model: only the first module
    called (the embedding) was compared, and a 1% tanh fault in the encoder was READY (its loss curves agreed).
    Each module's first call of the first step is compared now, on the inputs it had on the target, named as
    the script names it (a variable, or a child of one: ``net.encoder``); the teacher called without gradients
    is not."""
    clean = _ready_and_a_fault_named(validate, "separate_modules.py", "perturb@aten::tanh,rel=0.01", "aten::tanh")
    assert clean.report["model"]["modules"] == {"embedding": "Embedding", "encoder": "Sequential", "head": "Linear"}
    assert "of embedding, encoder, head" in clean.findings("numerics", "info")[0]["title"]
    assert clean.report["numerics"]["gradients"]["leaves"] == 7, "every trained parameter's gradient is compared"
    faulty = validate(script("separate_modules.py"), "--emulator-profile", "exact",
                      env={"NEURON_VALIDATE_FAULTS": "perturb@aten::tanh,rel=0.01"})
    (numerics,) = faulty.findings("numerics", "error")
    assert numerics["data"]["culprit"].startswith("encoder."), numerics
    compiled = validate(script("separate_modules.py"), "--mode", "compile")
    assert compiled.report["verdict"] == "ready", compiled.stdout
    assert compiled.report["compiled"]["outputs"]["ok"] and "eager and compiled outputs (3)" in compiled.stdout


def test_a_gans_generator_is_compared_with_its_discriminator_and_a_fault_in_it_is_named(validate):
    """dcgan's first step: D's backward on real data, then G's fake through D, D's second backward, D's step.
    A WGAN's: three critic steps with G's fakes made under no_grad, then G's step. Capture stopped at the first
    backward() (dcgan) or the first optimizer step (WGAN) and compared D alone: a 1% tanh fault in G was READY
    (dcgan's curves agree within 0.2%). It now lasts until every optimizer the script made has stepped."""
    fault = "perturb@aten::tanh,rel=0.01"
    for name, modules, culprit in (("gan_step.py", {"netD": "Sequential", "netG": "Sequential"}, "netG.4"),
                                   ("wgan_steps.py", {"critic": "Sequential", "generator": "Sequential"},
                                    "generator.3")):
        clean = validate(script(name), "--emulator-profile", "exact")
        assert clean.report["verdict"] == "ready", clean.stdout
        assert clean.report["model"]["modules"] == modules
        faulty = validate(script(name), "--emulator-profile", "exact", env={"NEURON_VALIDATE_FAULTS": fault})
        assert faulty.report["verdict"] == "not ready", faulty.stdout
        (numerics,) = faulty.findings("numerics", "error")
        assert numerics["data"]["culprit"] == culprit and numerics["data"]["op"] == "aten::tanh", numerics
