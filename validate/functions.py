"""The functions convention's side: one worker process drives the reference, the golden and the target.

The script is imported (not run as ``__main__``), its model and inputs built
once on the CPU, and every side gets a copy of the same weights: the
reference, the float64 golden, and the target (eager, and compiled in compile
mode). Running all sides in one process keeps the localisation's drill-down,
which reruns one module on every side with the reference's inputs, in one
address space; the run survives a target crash because that process is a
worker of the runner's supervisor (validate/execute.py).
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from .common import ChildSpec, ScriptProblem, SideObservations, localization_observations
from .probes import compile_observations, error_info, fingerprint, named_inputs, placement_scan, wide_tensors

MODULE_NAME = "neuron_validate_user_script"
DEFAULT_STEPS = 10


def _load_module(path: str):
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - any failure at import is the script's
        info = error_info(exc, files=[path], phase="import")
        where = f" ({info['source']['text']})" if info["source"] else ""
        if isinstance(exc, ImportError):
            raise ScriptProblem(f"the script fails to import: {info['message']}{where}") from None
        if isinstance(exc, SystemExit):
            raise ScriptProblem(f"the script exited while being imported (status {exc.code})") from None
        raise ScriptProblem(f"the script raised while being imported: {info['message']}{where}") from None
    return module


def _get(module, names: tuple[str, str], what: str, path: str):
    import torch  # noqa: F401

    fn_name, value_name = names
    if hasattr(module, fn_name):
        fn = getattr(module, fn_name)
        if not callable(fn):
            raise ScriptProblem(f"{fn_name} is a {type(fn).__name__}, expected a function")
        try:
            return fn(), f"{fn_name}()"
        except Exception as exc:  # noqa: BLE001
            info = error_info(exc, files=[path])
            where = f" ({info['source']['text']})" if info["source"] else ""
            raise ScriptProblem(f"{fn_name}() raised: {info['message']}{where}") from None
    if hasattr(module, value_name):
        return getattr(module, value_name), value_name
    raise ScriptProblem(f"no {what} found: define {fn_name}() (or {value_name})")


def _split_inputs(inputs):
    import torch

    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    raise ScriptProblem(f"inputs are a {type(inputs).__name__}: expected a tensor, a tuple of positional "
                        "arguments or a dict of keyword arguments")


def _loss_callable(module, raw_inputs):
    """loss(output) for the model: the script's loss_fn(output[, inputs]) or the zoo's output loss."""
    fn = getattr(module, "loss_fn", None)
    if fn is None:
        from model_zoo.built import output_loss

        return (lambda out: output_loss(out)), "the model's own loss, else the mean square of its outputs"
    if not callable(fn):
        raise ScriptProblem(f"loss_fn is a {type(fn).__name__}, expected a function")
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = [None]
    if len(params) >= 2:
        return (lambda out: fn(out, raw_inputs)), "loss_fn(output, inputs)"
    return fn, "loss_fn(output)"


def _neutralise_dropout(model) -> int:
    from model_zoo.built import neutralise_dropout

    return neutralise_dropout(model)


def _pass(model, args, kwargs, device, *, double: bool, loss, prepare=None, grad_output=None, rng_state=None,
          files=()):
    """(output tensors, parameter gradients, what was called) of one forward and backward pass, on the CPU.

    The backward pass starts from ``loss(output)``, else from ``grad_output`` (see diff.localize). With
    ``rng_state`` (diff.draws.StartState) every random draw comes from the CPU's generator at that state, and
    Python's and NumPy's generators start there too (diff.draws)."""
    import contextlib

    import torch
    from torch.utils._pytree import tree_flatten

    from diff.draws import same_draws
    from diff.sides import run_model, to_device

    draws = (same_draws(rng_state, double=double, source_files=files) if rng_state is not None
             else contextlib.nullcontext())
    with draws:
        run = run_model(model, device=device, dtype=torch.float64 if double else None,
                        inputs=(tuple(args), dict(kwargs)),
                        loss=(lambda out, batch: loss(out)) if loss is not None else None, prepare=prepare,
                        grad_output=grad_output, loss_optional=loss is None,
                        keep_output=lambda out: [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)])
    grads = None
    if run.grads is not None:
        grads = {n: to_device(g, "cpu") for n, g in run.grads.items() if g is not None}
    return to_device(run.outputs, "cpu", requires_grad=False), grads, run.runner


def observe(spec: ChildSpec, progress) -> dict:
    """Runs every side in this process; the observations, or ``script_problem`` when the script is at fault."""
    result: dict = {"convention": "functions", "notes": [], "reference": {}, "target": {}}
    try:
        _observe(spec, result, progress)
    except ScriptProblem as exc:
        result["script_problem"] = str(exc)
    return result


@dataclass(slots=True, kw_only=True)
class _Script:
    """What the script gives: its module, model and inputs (on the CPU), and its loss."""

    path: str
    module: Any
    model: Any
    args: tuple
    kwargs: dict
    loss: Callable | None  # loss(output); None where no loss can be trained (see _check_reference)
    loss_from: str
    inputs_from: str

    @property
    def files(self) -> list[str]:
        return [self.path]


def _observe(spec: ChildSpec, result: dict, progress) -> None:
    """The three questions in order, each step's observations into ``result``; a ScriptProblem when the
    script is at fault."""
    from conformance.target import TargetError, resolve_target

    try:
        target = resolve_target(spec.target, backend_modules=spec.backend_modules)
        reference = resolve_target(spec.reference)
    except TargetError as exc:
        raise ScriptProblem(str(exc)) from None
    result["manifest"] = {"target": target.manifest(), "reference": reference.manifest()}
    progress(side="both", phase="import")
    import torch

    from .named_device import torch_neuronx_stand_in

    with torch_neuronx_stand_in(torch, target.device.type, on_target=True):
        script = _load_script(spec.script, result)
    # 1. Does it run on the reference? A failure here is the script's problem.
    progress(side="reference", phase="forward")
    ref_side, steps = _check_reference(spec, script, reference, result)
    tgt_side = SideObservations(fingerprints=dict(ref_side.fingerprints))
    with target.track_ops() as tracker:
        # 2. Does it compute the same thing on the target, and where does it first go wrong?
        _compare_on_target(script, target, reference, tgt_side, result, progress)
        # 3. Does it learn the same way?
        if steps and tgt_side.ran:
            _train_curves(spec, script, steps, target, reference, ref_side, tgt_side, result, progress)
    _target_facts(script, target, tracker.trace, tgt_side, result)
    result["reference"] = ref_side.to_dict()
    result["target"] = tgt_side.to_dict()


def _load_script(path: str, result: dict) -> _Script:
    """Imports the script and takes its model, inputs and loss (dropout neutralised, noted in ``result``)."""
    import torch

    module = _load_module(path)
    model, model_from = _get(module, ("get_model", "model"), "model", path)
    if not isinstance(model, torch.nn.Module):
        raise ScriptProblem(f"{model_from} is a {type(model).__name__}, expected a torch.nn.Module")
    raw_inputs, inputs_from = _get(module, ("get_inputs", "example_inputs"), "inputs", path)
    args, kwargs = _split_inputs(raw_inputs)
    model = model.cpu()
    dropped = _neutralise_dropout(model)
    if dropped:
        result["notes"].append(f"dropout neutralised in {dropped} places so that both sides compute the same thing")
    loss, loss_from = _loss_callable(module, raw_inputs)
    result["model"] = {"class": type(model).__name__, "from": model_from, "inputs_from": inputs_from,
                       "loss": loss_from, "parameters": sum(p.numel() for p in model.parameters())}
    return _Script(path=path, module=module, model=model, args=args, kwargs=kwargs, loss=loss, loss_from=loss_from,
                   inputs_from=inputs_from)


def _check_reference(spec: ChildSpec, script: _Script, reference, result: dict) -> tuple[SideObservations, int]:
    """Runs the model on the reference (a failure is the script's problem) and checks its loss; returns the
    reference's side and the training steps (0, and ``script.loss`` None, when no loss can be trained)."""
    start = time.perf_counter()
    try:
        _pass(script.model, script.args, script.kwargs, reference.device, double=False, loss=None)
    except Exception as exc:  # noqa: BLE001
        info = error_info(exc, files=script.files)
        where = f" at {info['source']['text']}" if info["source"] else ""
        hint = ""
        if any(w in info["message"].lower() for w in ("shape", "size", "dimension", "mat1", "expected input")):
            hint = f" (do the inputs from {script.inputs_from} have the shapes the model expects?)"
        raise ScriptProblem(f"the model raised on the reference ({reference.describe()}): "
                            f"{info['message']}{where}{hint}") from None
    steps = DEFAULT_STEPS if spec.steps is None else spec.steps
    problem = _loss_problem(script)
    if problem:
        if spec.steps_given and spec.steps:
            raise ScriptProblem(f"--steps {spec.steps}: no loss curve can be trained: {problem}")
        result["notes"].append(f"gradients and loss curves skipped: {problem}")
        script.loss, steps = None, 0
    side = SideObservations(ran=True, seconds=time.perf_counter() - start)
    side.fingerprints = {"parameters": fingerprint(script.model.state_dict().values()),
                         "inputs": fingerprint(t for _, t in named_inputs(script.args, script.kwargs))}
    return side, steps


def _loss_problem(script: _Script) -> str | None:
    """Why the script's loss cannot be trained (not a scalar, no gradient, no trainable parameters), or None."""
    import torch

    try:
        value = script.loss(copy.deepcopy(script.model)(*script.args, **script.kwargs))
    except Exception as exc:  # noqa: BLE001
        return f"{script.loss_from} raised: {error_info(exc, files=script.files)['message']}"
    if not isinstance(value, torch.Tensor):
        return f"{script.loss_from} returned a {type(value).__name__}, expected a scalar tensor"
    if value.numel() != 1:
        return f"{script.loss_from} returned a tensor of shape {tuple(value.shape)}, expected a scalar"
    if not value.requires_grad:
        return f"{script.loss_from} does not require grad (no trainable parameters reach it)"
    if not any(p.requires_grad for p in script.model.parameters()):
        return "the model has no trainable parameters"
    return None


def _compare_on_target(script: _Script, target, reference, tgt_side: SideObservations, result: dict, progress) -> None:
    """The localisation (layers, then ATen ops) and, under a compile target, the compiled check."""
    progress(side="target", phase="localize")
    start = time.perf_counter()
    loc = localization_observations(script.model, script.args, script.kwargs, target=target, reference=reference,
                                    loss_fn=script.loss, files=script.files)
    result.update(loc)
    failure = (loc.get("localization") or {}).get("target_failure")
    if failure:
        tgt_side.error = {"type": failure["message"].split(":")[0], "message": failure["message"],
                          "source": failure["source"], "phase": failure["phase"], "module": failure["module"],
                          "op": failure["op"]}
    if (loc.get("localization") or {}).get("ok"):
        progress(side="target", phase="eval mode")
        result.update(eval_mode_check(script.model, script.args, script.kwargs, target=target, reference=reference,
                                      files=script.files))
    if target.compiles and not failure:
        progress(side="target", phase="compile")
        result["compiled"] = compiled_check(script.model, script.args, script.kwargs, target=target,
                                            reference=reference, loss=script.loss, files=script.files)
        if result["compiled"].get("error"):
            tgt_side.error = result["compiled"]["error"]
    tgt_side.ran = tgt_side.error is None
    tgt_side.seconds = time.perf_counter() - start


def _train_curves(spec: ChildSpec, script: _Script, steps: int, target, reference, ref_side: SideObservations,
                  tgt_side: SideObservations, result: dict, progress) -> None:
    """Both sides' loss curves, and the band's perturbed reference trainings; a target that fails to train
    is its side's error."""
    from diff.curves import NOISE_RUNS as CURVE_NOISE_RUNS
    from diff.curves import band_precision, train_curve
    from diff.precision import model_for, perturbed_runs

    def step_loss(m, inputs):
        a, k = inputs
        return script.loss(m(*a, **k))

    def on_step(side):
        return lambda step, value: progress(side=side, phase="train", step=step + 1, steps=steps, loss=value)

    common = dict(batch=lambda step: (script.args, script.kwargs), loss=step_loss,
                  optimizer_factory=_optimizer_factory(script.module), steps=steps, seed=spec.seed)
    ref_side.curve = train_curve(script.model, device=reference.device, label=reference.describe(),
                                 on_step=on_step("reference"), **common).to_dict()
    try:
        tgt_side.curve = train_curve(script.model, device=target.device, label=target.describe(),
                                     prepare=target.prepare, synchronize=target.synchronize,
                                     on_step=on_step("target"), **common).to_dict()
    except Exception as exc:  # noqa: BLE001 - the target failing to train is a finding
        tgt_side.error = error_info(exc, files=script.files, phase="training")
        tgt_side.ran = False
        return
    # the band of the curves: reference trainings perturbed as the device's precision allows
    precision = band_precision(model_for(target), ref_side.curve["losses"], tgt_side.curve["losses"])
    if precision:
        progress(side="reference", phase="perturbed curves")
        result["perturbed_curves"] = [c.to_dict() for c in perturbed_runs(
            lambda: train_curve(script.model, device=reference.device, label="perturbed reference", **common),
            precision, runs=CURVE_NOISE_RUNS, seed=spec.seed)]


def _target_facts(script: _Script, target, trace, tgt_side: SideObservations, result: dict) -> None:
    """What the target's run shows besides its numbers: host fallbacks, placement, 64-bit tensors, graphs."""
    from diff.sides import side_model

    tgt_side.extra["fallback_ops"] = list(trace.fallback) if trace else []
    tgt_side.extra["executed_ops"] = len(trace.executed) if trace else None
    moved = side_model(script.model, target.device)
    tgt_side.extra["placement"] = placement_scan(moved, target.device.type)
    tgt_side.extra["wide_tensors"] = wide_tensors(
        [*named_inputs(script.args, script.kwargs), *script.model.named_parameters(), *script.model.named_buffers()])
    if target.compiles:
        seen = (result.get("compiled") or {}).get("graphs_seen") or []
        tgt_side.extra["compile"] = compile_observations(seen, emulated=target.is_emulated)


def _optimizer_factory(module):
    import torch

    fn = getattr(module, "get_optimizer", None)
    if fn is not None:
        return fn
    return lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9)


def compiled_check(model, args, kwargs, *, target, reference, loss=None, grad_output=None, files=()) -> dict:
    """The compiled target's outputs and gradients against the eager reference and the float64 golden.

    Every side starts from the same generator state and draws the reference's numbers (diff.draws), in the
    compiled code too: dropout stays on and is compared like any other op.
    """
    from diff.draws import StartState

    return _judged_check(model, args, kwargs, target=target, reference=reference, loss=loss,
                         grad_output=grad_output, files=files, rng_state=StartState.now())


def eval_mode_check(model, args, kwargs, *, target, reference, files=()) -> dict:
    """The compared call once more with the model in eval mode and without gradients, as inference runs it: the
    target's outputs against the reference and the float64 golden (``{"eval_mode": ...}``; empty where the
    model is in eval mode already, the compared call being inference itself). Where they differ, the call is
    also localised in eval mode, layer by layer, to name the layer where it can.

    Eval mode runs other kernels than training: batch norm's running statistics, attention without dropout,
    and for ``nn.TransformerEncoderLayer`` without gradients one fused kernel for the whole layer
    (``aten::_transformer_encoder_layer_fwd``, on any device PyTorch supports, PrivateUse1 included). The
    compared call ran in training mode and the curves are training losses, so a 2% fault in that kernel was
    READY. PyTorch takes the fused path only where no hook is attached to the layer, so the outputs are
    judged here from a plain call, and the localisation (hooks on every module) runs the layer op by op. The
    model's modes are put back."""
    from diff.draws import StartState

    modes = [(m, m.training) for m in model.modules()]
    if not any(training for _, training in modes):
        return {}
    model.eval()
    try:
        with target.track_ops() as plain:
            seen = _judged_check(model, args, kwargs, target=target.in_mode("eager"), reference=reference,
                                 loss=None, grad_output=None, files=files, rng_state=StartState.now(),
                                 compiled=False)
        if "outputs" in seen and not seen["outputs"]["ok"]:
            with target.track_ops() as hooked:
                seen.update(localization_observations(model, args, kwargs, target=target, reference=reference,
                                                      files=files))
            if plain.trace is not None and hooked.trace is not None:  # the kernels only the plain call ran
                seen["unhooked_ops"] = sorted(set(plain.trace.executed) - set(hooked.trace.executed))
    except Exception as exc:  # noqa: BLE001 - evidence, never a reason to lose the run (the harness's own failure)
        seen = {"not_compared": error_info(exc, files=files)["message"]}
    finally:
        for m, training in modes:
            m.training = training
    return {"eval_mode": seen}


def _judged_check(model, args, kwargs, *, target, reference, loss, grad_output, files, rng_state,
                  compiled: bool = True) -> dict:
    """The target's outputs (and gradients) from a plain call, prepared as the target runs it (compiled in
    compile mode), against the eager reference and the float64 golden, judged as the layers are.
    ``compiled``: the target compiles, and must compile a graph and not recompile on the same shapes."""
    from diff import TolerancePolicy
    from diff.judge import Judge

    import functools

    from diff.sides import to_device

    from diff.precision import model_for, perturbed_runs

    common = dict(loss=loss, grad_output=grad_output, rng_state=rng_state, files=files)
    precision = model_for(target)
    judge = Judge(tolerance=TolerancePolicy().for_dtype(type(model).__name__, scope="model"), precision=precision)
    try:
        ref_out, ref_grads, _ = _pass(model, args, kwargs, reference.device, double=False, **common)
    except Exception as exc:  # noqa: BLE001
        if compiled:
            raise
        return {"reference_error": error_info(exc, files=files, phase="forward")}

    @functools.cache
    def golden():  # only when a comparison needs it; a failure means judging against the reference alone
        return _pass(model, args, kwargs, "cpu", double=True, **common)

    @functools.cache
    def noisy():  # the reference perturbed as the device's precision allows (diff.precision), when needed
        return perturbed_runs(lambda: _pass(model, args, kwargs, reference.device, double=False, **common),
                              precision, runs=2)

    def noise(part: int):
        def runs():
            out = type(noisy())(r[part] for r in noisy())
            out.reasons = noisy().reasons
            return out
        return runs

    try:
        out, grads, runner = _pass(model, args, kwargs, target.device, double=False, prepare=target.prepare, **common)
        if compiled:
            again_args, again_kwargs = to_device((tuple(args), dict(kwargs)), target.device)
            runner(*again_args, **again_kwargs)  # same shapes again: must not recompile
    except Exception as exc:  # noqa: BLE001
        return {"error": error_info(exc, files=files, phase="compile" if compiled else "forward")}
    from conformance.target import EAGER_UNDER_COMPILE, ran_eagerly

    outputs = judge(out, ref_out, golden=lambda: golden()[0], noise=noise(0)).decided
    if not compiled:  # outputs whose shapes depend on the values (boxes kept by a threshold) may differ so
        shapes = [[tuple(t.shape) for t in side] for side in (out, ref_out)]
        seen = {"outputs": outputs.to_dict(), "shapes_differ": shapes[0] != shapes[1]}
        if not outputs and precision and not seen["shapes_differ"]:
            # How far the device's rounding alone moves these outputs: the reference perturbed as it allows.
            from diff.localize.core import relative_error

            seen["target_rel_error"] = relative_error(out, ref_out)
            seen["reference_rel_error"] = max((relative_error(run[0], ref_out) for run in noisy()), default=0.0)
        return seen
    if ran_eagerly(runner):  # never a pass: the compiler was not tested
        return {"error": {"type": "RuntimeError", "message": f"compile mode: {EAGER_UNDER_COMPILE}", "source": None,
                          "phase": "compile", "import_error": False}, "graphs": 0}
    gradients = (judge(grads, ref_grads, golden=lambda: golden()[1], noise=noise(1), path="grad").decided
                 if grads is not None else None)
    return {"outputs": outputs.to_dict(), "gradients": gradients.to_dict() if gradients is not None else None,
            "graphs": runner.graphs, "graphs_seen": runner.counter.seen}
