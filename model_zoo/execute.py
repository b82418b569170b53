"""Runs one model-zoo configuration on the reference and on the target.

The model is built once on the CPU with the config's seed (dropout
neutralised by the builder); each side gets a copy of the same weights and
the same inputs (diff.sides.run_model). Depending on the mode it compares
the outputs (eval), the outputs, loss and every parameter gradient (train),
or the per-step losses, last gradients and the parameters after K optimizer
steps (steps), with the model-scope tolerances, through the one judge
(diff.judge): a float64 copy of the model is the golden, built only when the
target does not match at once, and a second reference run tells a
non-deterministic model (``inconclusive``) from a wrong target.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch

from conformance.case import Case
from conformance.host_copies import HostExecution, watch_host_copies
from conformance.outcome import Outcome, Status
from conformance.target import EAGER_UNDER_COMPILE, ran_eagerly
from diff.judge import Judge, classify_error, one_line
from diff.precision import model_for, perturbed_runs
from diff.replay import replay_ops
from diff.sides import run_model
from diff.tolerances import TolerancePolicy
from runner.executors import Executor


NOISE_RUNS = 2  # perturbed reference runs of a zoo case whose target has a precision model (cost: bench/model_zoo.py)


def model_case(config) -> Case:
    """The Case of a model_zoo.ModelConfig. Its config holds only the fields set, so its id survives a new field."""
    return Case(kind="model", name=config.arch, family=config.family, dtype=config.dtype,
                mode=config.mode if config.mode != "steps" else f"steps{config.steps}",
                config=config.set_fields(), seed=config.seed)


def current_case(case: Case) -> Case:
    """A stored model case as this version makes it: its architecture under its current name (registry aliases),
    its config reduced to the fields set. The gate finds a baseline's result under this case's id."""
    from . import registry
    from .config import ModelConfig

    config = ModelConfig.from_dict(case.config)
    return model_case(config.replace(arch=registry.current_name(config.arch)))


def run_side(built, config, device, *, prepare=None, dtype=None, in_place: bool = False) -> dict:
    """Runs the config's mode on one side; returns what is compared (all on that side's device).

    By default the side trains a copy of ``built.model``; ``in_place`` trains
    ``built.model`` itself (no copy: for the last run of a case, when the
    model's parameter memory matters), leaving it trained.
    """
    def batch(step: int) -> dict:
        return built.inputs if step == 0 else built.make_batch(step)

    common = dict(device=device, dtype=dtype, inputs=batch, prepare=prepare, copy_model=not in_place)
    if config.mode == "eval":
        run = run_model(built.model, train=False, **common)
        return {"outputs": run.outputs}
    steps = config.steps if config.mode == "steps" else 1
    run = run_model(built.model, train=True, steps=steps, loss=built.loss_fn,
                    optimizer_factory=built.optimizer_factory if config.mode == "steps" else None,
                    keep_params=config.mode == "steps", **common)
    result: dict[str, Any] = {"loss": run.losses if config.mode == "steps" else run.losses[0], "grads": run.grads}
    if config.mode == "train":
        result["outputs"] = run.outputs
    else:
        result["params"] = run.params
    return result


def execute_model_case(case: Case, ctx) -> Outcome:
    from . import ModelBuildError, ModelConfig, build

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
    compiled: list = []  # the target's compiled model: how many graphs it compiled
    prepare = None
    if target.compiles or config.execution == "compile":
        def prepare(model):
            compiled.append(target.compile(model))
            return compiled[-1]
    target.peak_memory(reset=True)
    t0 = time.perf_counter()
    watch = target.device.type != "cpu"  # host<->device copies need a device to copy from
    with target.track_ops() as tracker, watch_host_copies(watch) as host:
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
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"fails on the reference: {one_line(exc)}",
                       evidence={"error": traceback.format_exc()}, timings=timings)
    timings["reference"] = time.perf_counter() - t0
    del built

    evidence: dict[str, Any] = {"config": str(config)}
    on_host = HostExecution(tracker.trace, host)
    on_host.record(evidence)
    peak = target.peak_memory()
    if peak is not None:
        evidence["peak_device_memory_bytes"] = peak
    if error is not None:
        evidence["error"] = traceback.format_exception_only(type(error), error)[-1].strip()
        return Outcome(case_id=case.id, status=classify_error(error), message=one_line(error), evidence=evidence,
                       timings=timings)
    if compiled:
        evidence["compiled_graphs"] = compiled[0].graphs
        if ran_eagerly(compiled[0]):  # never a pass: the compiler was not tested
            return Outcome(case_id=case.id, status=Status.ERROR, message=f"harness error: {EAGER_UNDER_COMPILE}",
                           evidence={**evidence, "harness_error": True}, timings=timings)

    t0 = time.perf_counter()
    precision = model_for(target)
    judge = Judge(tolerance=TolerancePolicy().for_dtype(config.arch, scope="model"), device=target.device.type,
                  precision=precision)
    verdict = judge(
        actual, expected, path="model",
        golden=lambda: run_side(build(config), config, "cpu", dtype=torch.float64, in_place=True),
        reference_again=lambda: run_side(build(config), config, reference.device, in_place=True),
        noise=lambda: perturbed_runs(lambda: run_side(build(config), config, reference.device, in_place=True),
                                     precision, runs=NOISE_RUNS, seed=case.seed),
        by_op=lambda: replay_ops(lambda: run_side(build(config), config, reference.device, in_place=True),
                                 device=target.device, precision=precision,
                                 judge_for=lambda op: Judge(tolerance=TolerancePolicy().for_dtype(op),
                                                            device=target.device.type, precision=precision)))
    timings["comparison"] = time.perf_counter() - t0
    if verdict.golden_error:
        evidence["golden_error"] = verdict.golden_error
    result = verdict.comparison
    evidence["metrics"] = result.worst
    evidence["compared"] = result.leaves
    if isinstance(expected.get("loss"), list):
        evidence["losses"] = {"reference": [float(x) for x in expected["loss"]],
                              "target": [float(x) for x in actual["loss"]]}
    if precision:
        evidence["precision_model"] = precision.to_dict()
    if verdict.noise is not None:
        evidence["noise_floor"] = verdict.noise.to_dict()
    if verdict.replay is not None:
        evidence["op_replay"] = verdict.replay.to_dict()
    if verdict.status is Status.INCONCLUSIVE and not verdict.nondeterministic:
        return Outcome(case_id=case.id, status=Status.INCONCLUSIVE, timings=timings, evidence=evidence,
                       message=verdict.message)
    if verdict.status is Status.INCONCLUSIVE:
        return Outcome(case_id=case.id, status=Status.INCONCLUSIVE, timings=timings, evidence=evidence,
                       message="the reference is non-deterministic: two CPU runs differ, so the values cannot be "
                               "judged (dtypes, shapes and devices agree)")
    if not verdict:
        evidence["mismatches"] = [m.to_dict() for m in result.mismatches[:10]]
        return Outcome(case_id=case.id, status=Status.MISMATCH, message=verdict.message + on_host.mismatch_note(),
                       evidence=evidence, timings=timings)
    if on_host.ops:
        return Outcome(case_id=case.id, status=Status.CPU_FALLBACK, evidence=evidence, timings=timings,
                       message=on_host.fallback_message())
    if verdict.within_precision:
        evidence["within_precision"] = verdict.noise.to_dict()
        return Outcome(case_id=case.id, status=Status.PASS, evidence=evidence, timings=timings,
                       message=f"all {result.leaves} compared tensors agree, {verdict.message}")
    return Outcome(case_id=case.id, status=Status.PASS, message=f"all {result.leaves} compared tensors match",
                   evidence=evidence, timings=timings)


def probe_model_reference(case: Case, ctx) -> None:
    """Runs only the reference side (after a crash or hang of the whole case)."""
    from . import ModelConfig, build

    config = ModelConfig.from_dict(dict(case.config))
    run_side(build(config), config, ctx.reference.device, in_place=True)


def write_model_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    """A script that rebuilds the config from the zoo and reruns it on both sides through the judge."""
    import json
    import os
    from pathlib import Path

    from conformance.settings import EMULATOR_ENV

    folder = Path(ctx.artifacts) / "repro" / case.id
    folder.mkdir(parents=True, exist_ok=True)
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
import torch
from conformance.target import resolve_target
from diff.judge import Judge
from diff.tolerances import TolerancePolicy
from model_zoo import ModelConfig, build
from model_zoo.execute import run_side

config = ModelConfig.from_dict(json.loads({json.dumps(json.dumps(case.config))}))
target = resolve_target(sys.argv[1] if len(sys.argv) > 1 else {str(ctx.target.spec)!r})
prepare = target.compile if target.compiles or config.execution == "compile" else None
actual = run_side(build(config), config, target.device, prepare=prepare)
expected = run_side(build(config), config, "cpu")
judge = Judge(tolerance=TolerancePolicy().for_dtype(config.arch, scope="model"), device=target.device.type)
verdict = judge(actual, expected, path="model",
                golden=lambda: run_side(build(config), config, "cpu", dtype=torch.float64))
print(verdict.status.value + ": " + verdict.comparison.report())
sys.exit(0 if verdict else 1)
'''
    path = folder / "repro.py"
    path.write_text(script)
    return str(path)


EXECUTOR = Executor(kind="model", execute=execute_model_case, probe_reference=probe_model_reference,
                    write_repro=write_model_repro)
