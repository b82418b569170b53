"""Runs one model-zoo configuration on the reference and on the target.

The model is built once on the CPU with the config's seed (dropout
neutralised by the builder); each side gets a copy of the same weights and
the same inputs. Depending on the mode it compares the outputs (eval), the
outputs, loss and every parameter gradient (train), or the per-step losses,
last gradients and the parameters after K optimizer steps (steps). Model
tolerances come from the tolerance policy's "model" scope; as in PyTorch's
benchmark accuracy check, a float64 copy of the model is the golden, built
only when the target does not match at once, and a second reference run
separates a non-deterministic model from a wrong target.
"""

from __future__ import annotations

import copy
import time
import traceback
from typing import Any, Mapping

import torch

from .case import Case
from .outcome import Outcome, Status

UNSUPPORTED_MARKERS = ("not implemented for", "not currently implemented", "could not run 'aten::", "notimplementederror",
                       "is only supported on")


def model_case(config) -> Case:
    """The Case of a model_zoo.ModelConfig."""
    return Case(kind="model", name=config.arch, family=config.family, dtype=config.dtype,
                mode=config.mode if config.mode != "steps" else f"steps{config.steps}",
                config={**config.to_dict(), "execution": config.execution}, seed=config.seed)


def plain_outputs(value: Any, depth: int = 0) -> Any:
    """Model outputs as nested dicts/lists of tensors (HF ModelOutputs become dicts; caches are dropped)."""
    if depth > 8:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach()  # an attached output's graph would keep every parameter alive
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, Mapping):
        out = {str(k): plain_outputs(v, depth + 1) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [plain_outputs(v, depth + 1) for v in value]
    return None  # caches and other objects: their content is already in the tensors we compare


def _float_inputs(inputs: dict, dtype) -> dict:
    def cast(v):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.to(dtype)
        if isinstance(v, dict):
            return {k: cast(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(cast(x) for x in v)
        return v

    return {k: cast(v) for k, v in inputs.items()}


def run_side(built, config, device, *, prepare=None, dtype=None, in_place: bool = False) -> dict:
    """Runs the config's mode on one side; returns what is compared (all on that side's device).

    By default the side trains a copy of ``built.model``; ``in_place`` trains
    ``built.model`` itself (no copy: for the last run of a case, when the
    model's parameter memory matters), leaving it trained.
    """
    model = built.model if in_place else copy.deepcopy(built.model)
    if dtype is not None:
        model = model.to(dtype)
    model = model.to(device)

    def batch(step: int) -> dict:
        data = built.inputs if step == 0 else built.make_batch(step)
        if dtype is not None:
            data = _float_inputs(data, dtype)
        from torch.utils._pytree import tree_map

        return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, data)

    forward = prepare(model) if prepare is not None else model
    if config.mode == "eval":
        model.eval()
        with torch.no_grad():
            return {"outputs": plain_outputs(forward(**batch(0)))}
    model.train()
    steps = config.steps if config.mode == "steps" else 1
    optimizer = built.optimizer_factory(model.parameters()) if config.mode == "steps" else None
    losses, outputs, grads = [], None, {}
    for step in range(steps):
        inputs = batch(step)
        out = forward(**inputs)
        loss = built.loss_fn(out, inputs)
        loss.backward()
        losses.append(loss.detach())
        if step == 0:
            outputs = plain_outputs(out)
        # No clones: the gradient tensors themselves are the result (set_to_none below gives the next step
        # new ones), so a side holds its parameters' memory once, not twice.
        grads = {n: (p.grad.detach() if p.grad is not None else None) for n, p in model.named_parameters()}
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)
    result: dict[str, Any] = {"loss": losses if config.mode == "steps" else losses[0], "grads": grads}
    if config.mode == "train":
        result["outputs"] = outputs
    else:
        result["params"] = {n: p.detach().clone() if in_place else p.detach() for n, p in model.named_parameters()}
    return result


def _error_status(exc: BaseException) -> Status:
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, NotImplementedError) or any(m in text for m in UNSUPPORTED_MARKERS):
        return Status.UNSUPPORTED
    return Status.ERROR


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def execute_model_case(case: Case, ctx) -> Outcome:
    from diff.compare import compare
    from diff.tolerances import TolerancePolicy
    from model_zoo import ModelBuildError, ModelConfig, build

    config = ModelConfig.from_dict({k: v for k, v in case.config.items()})
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        built = build(config)
    except ModelBuildError as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"cannot be built on the reference: {exc}",
                       evidence={"error": str(exc)})
    timings["generation"] = time.perf_counter() - t0
    target, reference = ctx.target, ctx.reference

    # The target trains a copy first; the reference then trains the built model itself. A case so holds
    # at most three copies of the parameters (built, target's, reference's gradients), not four: large
    # timm models then fit the 4 GiB worker cap. Reruns (golden, determinism) rebuild the model.
    prepare = None
    if target.compiles or config.execution == "compile":
        prepare = lambda m: torch.compile(m, backend=target.compile_backend(), dynamic=False)  # noqa: E731
    _peak_memory(target, reset=True)
    t0 = time.perf_counter()
    with target.track_ops() as tracker:
        try:
            actual = run_side(built, config, target.device, prepare=prepare)
            target.synchronize()
            error = None
        except Exception as exc:  # noqa: BLE001
            actual, error = None, exc
    timings["target"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    try:
        expected = run_side(built, config, reference.device, in_place=True)
    except Exception as exc:  # noqa: BLE001
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"fails on the reference: {_one_line(exc)}",
                       evidence={"error": traceback.format_exc()}, timings=timings)
    timings["reference"] = time.perf_counter() - t0
    del built

    evidence: dict[str, Any] = {"config": str(config)}
    trace = tracker.trace
    if trace is not None:
        evidence["fallback_ops"] = list(trace.fallback)
        evidence["executed_ops"] = list(trace.executed)
    peak = _peak_memory(target)
    if peak is not None:
        evidence["peak_device_memory_bytes"] = peak
    if error is not None:
        evidence["error"] = traceback.format_exception_only(type(error), error)[-1].strip()
        return Outcome(case_id=case.id, status=_error_status(error), message=_one_line(error), evidence=evidence,
                       timings=timings)

    t0 = time.perf_counter()
    tolerance = TolerancePolicy().for_dtype(config.arch, scope="model")
    result = compare(actual, expected, tolerance=tolerance, device=target.device.type, path="model")
    if not result and all(m.kind in ("values", "nonfinite") for m in result.mismatches):
        try:
            golden = run_side(build(config), config, "cpu", dtype=torch.float64, in_place=True)
            result = compare(actual, expected, golden=golden, tolerance=tolerance, device=target.device.type,
                             path="model")
        except Exception as exc:  # noqa: BLE001 - no golden: judge against the reference alone
            evidence["golden_error"] = _one_line(exc)
        if not result:
            again = run_side(build(config), config, reference.device, in_place=True)
            if not compare(again, expected, tolerance=tolerance):
                timings["comparison"] = time.perf_counter() - t0
                return Outcome(case_id=case.id, status=Status.SKIP, timings=timings, evidence=evidence,
                               message="the reference is non-deterministic: two CPU runs differ")
    timings["comparison"] = time.perf_counter() - t0
    evidence["metrics"] = result.worst
    evidence["compared"] = result.leaves
    if isinstance(expected.get("loss"), list):
        evidence["losses"] = {"reference": [float(x) for x in expected["loss"]],
                              "target": [float(x) for x in actual["loss"]]}
    if not result:
        evidence["mismatches"] = [m.to_dict() for m in result.mismatches[:10]]
        message = result.summary()
        if trace is not None and trace.fallback:
            message += f" [host fallback: {', '.join(trace.fallback[:3])}]"
        return Outcome(case_id=case.id, status=Status.MISMATCH, message=message, evidence=evidence, timings=timings)
    if trace is not None and trace.fallback:
        return Outcome(case_id=case.id, status=Status.CPU_FALLBACK, evidence=evidence, timings=timings,
                       message=f"numerically right, but ran on the host: {', '.join(trace.fallback[:4])}")
    return Outcome(case_id=case.id, status=Status.PASS, message=f"all {result.leaves} compared tensors match",
                   evidence=evidence, timings=timings)


def probe_model_reference(case: Case, ctx) -> None:
    """Runs only the reference side (after a crash or hang of the whole case)."""
    from model_zoo import ModelConfig, build

    config = ModelConfig.from_dict(dict(case.config))
    run_side(build(config), config, ctx.reference.device)


def _peak_memory(target, reset: bool = False) -> int | None:
    module = getattr(torch, target.spec.device, None) if target.kind != "cpu" else None
    if module is None or not hasattr(module, "max_memory_allocated"):
        return None
    if reset and hasattr(module, "reset_peak_memory_stats"):
        module.reset_peak_memory_stats()
        return None
    return int(module.max_memory_allocated())


def write_model_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    """A script that rebuilds the config from the zoo and reruns it on both sides."""
    from pathlib import Path

    folder = Path(ctx.artifacts) / "repro" / case.id
    folder.mkdir(parents=True, exist_ok=True)
    import json
    import os

    from .settings import EMULATOR_ENV

    env = {k: os.environ[k] for k in EMULATOR_ENV if k in os.environ}
    summary = outcome.message[:300].replace('"""', "'")
    script = f'''#!/usr/bin/env python
"""Reproducer for {case.title} (case {case.id}).

Outcome: {outcome.status.value}: {summary}

Run:  python repro.py   (needs neuron-validate installed: the model comes from its zoo)
"""
import json, os, sys
for k, v in json.loads({json.dumps(json.dumps(env))}).items():
    os.environ.setdefault(k, v)
from conformance.model_case import run_side
from conformance.target import resolve_target
from diff.compare import compare
from diff.tolerances import TolerancePolicy
from model_zoo import ModelConfig, build

config = ModelConfig.from_dict(json.loads({json.dumps(json.dumps(case.config))}))
target = resolve_target(sys.argv[1] if len(sys.argv) > 1 else {str(ctx.target.spec)!r})
built = build(config)
expected = run_side(built, config, "cpu")
actual = run_side(built, config, target.device, prepare=target.prepare if target.compiles else None)
result = compare(actual, expected, tolerance=TolerancePolicy().for_dtype(config.arch, scope="model"),
                 device=target.device.type, path="model")
print(result.report())
sys.exit(0 if result else 1)
'''
    path = folder / "repro.py"
    path.write_text(script)
    return str(path)
