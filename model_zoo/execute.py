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

A configuration whose reference keeps no significant bit under the device's
precision (the noise floor's condition estimate; typically batch norm over
the few values per channel that two small images leave) and in which every op
agrees alone (diff.replay) is judged again on a larger input
(:func:`larger_inputs`): the first that the judge can decide gives the
case's verdict, and the outcome says which input that was and why. It stays
``inconclusive`` only where no larger input can be judged either. The case
keeps its id: its configuration is unchanged.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from conformance.case import Case
from conformance.host_copies import HostExecution, watch_host_copies
from conformance.outcome import GOLDEN_ERROR, REFERENCE_RAISED, Outcome, Status
from conformance.serialize import value_bytes
from conformance.target import EAGER_UNDER_COMPILE, ran_eagerly
from diff.judge import Judge, classify_error, one_line
from diff.precision import model_for, perturbed_runs
from diff.replay import replay_ops
from diff.sides import run_model
from diff.tolerances import TolerancePolicy
from runner.executors import Executor
from runner.refcache import tensor_bytes
from runner.worker import (REFERENCE_OVERRAN, REFERENCE_SHARE_MB, allocation_failure, memory_allowance, peak_growth,
                           return_freed_memory)

from .built import left_behind_by_to


NOISE_RUNS = 2  # perturbed reference runs of a zoo case whose target has a precision model (cost: bench/model_zoo.py)
CONDITIONING_BATCH = 4  # an ill-conditioned configuration is judged again on this many times its batch
# A model case's cached reference holds its outputs, loss and every gradient (and parameters after K steps):
# larger than an op's samples, so its entries may be larger too (runner.refcache bounds the file as a whole).
MAX_CACHED_MODEL_BYTES = 16 << 20


def model_case(config) -> Case:
    """The Case of a model_zoo.ModelConfig. Its config holds only the fields set, so its id survives a new field."""
    return Case(kind="model", name=config.arch, category=config.family, dtype=config.dtype,
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


@dataclass(slots=True)
class TargetRun:
    """The target side of a case: what it computed (or the error it raised), what ran on the host, the
    compiled model (None when eager) and the device's peak memory."""

    actual: dict | None
    error: Exception | None
    host: HostExecution
    compiled: Any
    peak_memory: int | None


def build_case(case: Case):
    """The case's configuration and its model built on the CPU, or a ``skip`` outcome when it cannot be built."""
    from . import ModelBuildError, ModelConfig, build

    config = ModelConfig.from_dict(dict(case.config))
    try:
        built = build(config)
    except ModelBuildError as exc:
        return config, Outcome(case_id=case.id, status=Status.SKIP, message=f"cannot be built on the reference: {exc}",
                               evidence={"error": str(exc)})
    stray = left_behind_by_to(built.model)
    if stray:  # any device would fail it ("expected device cpu but got ..."): not the target's to answer for
        return config, Outcome(case_id=case.id, status=Status.SKIP,
                               message=f"the model runs on the CPU only: .to(device) leaves {', '.join(stray)} behind "
                                       "(a plain container, not nn.ModuleList/ModuleDict)",
                               evidence={"left_behind_by_to": stray})
    return config, built


def run_target(built, config, target) -> TargetRun:
    """Trains a copy of the built model on the target, inside the backend's op tracking and the host-copy watch.

    The target goes first; the reference then trains the built model itself. A case so holds at most three
    copies of the parameters (built, target's, reference's gradients), not four: large timm models then fit
    the 4 GiB worker cap. Reruns (golden, determinism) rebuild the model.
    """
    compiled: list = []
    prepare = None
    if target.compiles or config.execution == "compile":
        def prepare(model):
            compiled.append(target.compile(model))
            return compiled[-1]
    target.peak_memory(reset=True)
    watch = target.device.type != "cpu"  # host<->device copies need a device to copy from
    with target.track_ops() as tracker, watch_host_copies(watch) as host:
        try:
            actual = run_side(built, config, target.device, prepare=prepare)
            target.synchronize()
            error = None
        except Exception as exc:  # noqa: BLE001
            actual, error = None, exc
    return TargetRun(actual=actual, error=error, host=HostExecution(tracker.trace, host),
                     compiled=compiled[0] if compiled else None, peak_memory=target.peak_memory())


def fingerprint(built) -> str:
    """A hash of the built model's parameters and buffers and of its first batch: a cached reference is reused
    only for the very same weights and inputs (a zoo builder or a model library that changed makes others)."""
    import hashlib

    from torch.utils._pytree import tree_leaves

    h = hashlib.blake2b(digest_size=16)
    named = [*built.model.state_dict().items(), *enumerate(tree_leaves(built.inputs))]
    for name, value in named:
        h.update(str(name).encode())
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(value_bytes(value))
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def run_reference(case: Case, built, config, ctx) -> tuple[dict, bool]:
    """The reference side's result and whether it came from the reference cache (runner.refcache).

    The CPU reference does not change when the backend build does: an entry keyed by the case id (config and
    seed), torch version and the reference's threads, whose weights and inputs have the same fingerprint, is
    reused; otherwise the reference trains the built model itself and the result is stored within the cache's
    size bounds.
    """
    cache = ctx.cache
    if cache is not None and tensor_bytes(list(built.model.parameters())) > MAX_CACHED_MODEL_BYTES:
        cache = None  # its gradients alone are over the entry bound: neither hashed nor stored
    key = ""
    if cache is not None:
        try:
            key = fingerprint(built)
        except Exception:  # noqa: BLE001 - weights it cannot hash (a sparse or quantized buffer): not cached
            cache = None
    entry = cache.get(case.id) if cache is not None else None
    if isinstance(entry, dict) and entry.get("fingerprint") == key and isinstance(entry.get("expected"), dict):
        return entry["expected"], True
    expected = run_side(built, config, ctx.reference.device, in_place=True)
    if cache is not None:
        cache.put(case.id, {"fingerprint": key, "expected": expected}, max_entry_bytes=MAX_CACHED_MODEL_BYTES)
    return expected, False


def judge_case(case: Case, config, actual: dict, expected: dict, target, reference, *, replay: bool = True):
    """The one judge on both sides' results; reruns (golden, determinism, noise floor, op replay) rebuild the model.
    ``replay``: judge an ill-conditioned whole op by op (diff.replay); without it, it stays inconclusive."""
    from . import build

    precision = model_for(target)

    def again(device=reference.device, dtype=None):
        return run_side(build(config), config, device, dtype=dtype, in_place=True)

    judge = Judge(tolerance=TolerancePolicy().for_dtype(config.arch, scope="model"), device=target.device.type,
                  precision=precision)
    verdict = judge(
        actual, expected, path="model",
        golden=lambda: again("cpu", torch.float64),
        reference_again=again,
        noise=lambda: perturbed_runs(again, precision, runs=NOISE_RUNS, seed=case.seed),
        by_op=None if not replay else lambda: replay_ops(
            again, device=target.device, precision=precision,
            judge_for=lambda op: Judge(tolerance=TolerancePolicy().for_dtype(op), device=target.device.type,
                                       precision=precision)))
    return verdict, precision


def verdict_outcome(case: Case, verdict, precision, side: TargetRun, expected: dict, evidence: dict,
                    timings: dict) -> Outcome:
    """The case's outcome from the judge's verdict and what ran on the host."""
    if verdict.golden_error:
        evidence[GOLDEN_ERROR] = verdict.golden_error
    result = verdict.comparison
    evidence["metrics"] = result.worst
    evidence["compared"] = result.leaves
    if isinstance(expected.get("loss"), list):
        evidence["losses"] = {"reference": [float(x) for x in expected["loss"]],
                              "target": [float(x) for x in side.actual["loss"]]}
    if precision:
        evidence["precision_model"] = precision.to_dict()
    if verdict.noise is not None:
        evidence["noise_floor"] = verdict.noise.to_dict()
    if verdict.replay is not None:
        evidence["op_replay"] = verdict.replay.to_dict()

    def outcome(status: Status, message: str) -> Outcome:
        return Outcome(case_id=case.id, status=status, message=message, evidence=evidence, timings=timings)

    if verdict.status is Status.INCONCLUSIVE and not verdict.nondeterministic:
        return outcome(Status.INCONCLUSIVE, verdict.message)
    if verdict.status is Status.INCONCLUSIVE:
        return outcome(Status.INCONCLUSIVE, "the reference is non-deterministic: two CPU runs differ, so the values "
                                            "cannot be judged (dtypes, shapes and devices agree)")
    if not verdict:
        evidence["mismatches"] = [m.to_dict() for m in result.mismatches[:10]]
        # Why the golden could not run stays in the evidence: the worker reads an allocation failure in the
        # message as the case's own.
        alone = ("judged against the CPU reference alone (its float64 golden could not run: golden_error): "
                 if verdict.golden_error else "")
        return outcome(Status.MISMATCH, alone + verdict.message + side.host.mismatch_note())
    if side.host.ops:
        return outcome(Status.CPU_FALLBACK, side.host.fallback_message())
    if verdict.within_precision:
        evidence["within_precision"] = verdict.noise.to_dict()
        return outcome(Status.PASS, f"all {result.leaves} compared tensors agree, {verdict.message}")
    return outcome(Status.PASS, f"all {result.leaves} compared tensors match")


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes a model's parameters and buffers hold, as built."""
    return tensor_bytes([*model.parameters(), *model.buffers()])


def reference_floor_mb(built, config) -> float:
    """MiB the CPU reference cannot do without: the model's parameters and buffers (at the run's dtype where it
    is narrower) and, when it trains, a gradient for each trainable parameter. Activations, optimizer state
    and the worker itself come on top, so a cap below this is certainly overrun."""
    narrow = getattr(torch, config.dtype, None)
    size = narrow.itemsize if isinstance(narrow, torch.dtype) else None

    def nbytes(t: torch.Tensor) -> int:
        width = min(t.element_size(), size) if size and t.is_floating_point() else t.element_size()
        return t.numel() * width

    model = built.model
    total = sum(nbytes(p) for p in model.parameters()) + sum(nbytes(b) for b in model.buffers())
    if config.mode != "eval":
        total += sum(nbytes(p) for p in model.parameters() if p.requires_grad)
    return total / 2**20


def over_the_cap(case: Case, built, config, ctx) -> Outcome | None:
    """A ``skip`` before either side runs, where the CPU reference alone cannot fit the run's memory cap.

    Otherwise the target would run up to the cap, a fresh worker would probe the reference alone up to it
    too, and the case would end as the same skip, two worker starts later.
    """
    cap = ctx.settings.run_cap_mb or ctx.settings.rss_limit_mb  # the run's, also where the sides run apart
    if not cap:
        return None
    floor = reference_floor_mb(built, config)
    if floor <= cap:
        return None
    return Outcome(case_id=case.id, status=Status.SKIP,
                   message=f"the CPU reference alone needs at least {floor:,.0f} MiB (the model's parameters and "
                           f"buffers{', and their gradients' if config.mode != 'eval' else ''}), over the memory "
                           f"cap of {cap:,} MiB: it cannot be judged under this cap (--rss-limit-mb)",
                   evidence={"reference_at_fault": True, "reference_floor_mb": round(floor, 1), "memory_cap_mb": cap})


def execute_model_case(case: Case, ctx) -> Outcome:
    """Builds the configuration, runs the target, then the reference (or takes it from the cache), and judges;
    an ill-conditioned configuration is judged again on a larger input (:func:`judged_on_larger_input`)."""
    t0 = time.perf_counter()
    config, built = build_case(case)
    if isinstance(built, Outcome):
        return built
    skipped = over_the_cap(case, built, config, ctx)
    if skipped is not None:
        return skipped
    outcome, verdict = judge_built(case, config, built, ctx, timings={"generation": time.perf_counter() - t0})
    if verdict is not None and verdict.ill_conditioned:
        return judged_on_larger_input(case, config, outcome, ctx)
    return outcome


def judge_built(case: Case, config, built, ctx, *, timings: dict, replay: bool = True):
    """The outcome of a built configuration, and the judge's verdict (None when the target raised or ran eagerly
    under compile). Takes ``built`` over: the reference trains it in place."""
    target, reference = ctx.target, ctx.reference

    # Each side gets the worker's memory cap to itself: the other side's resident share comes on top (the
    # reference's built model while the target runs, the target's results while the reference runs).
    allowance = {"target": model_bytes(built.model) + tensor_bytes(built.inputs)}
    t0 = time.perf_counter()
    with memory_allowance(allowance["target"]) as given:
        side = run_target(built, config, target)
    allowance["target"] = given
    timings["target"] = time.perf_counter() - t0

    overran = side.error is not None and allocation_failure(f"{type(side.error).__name__}: {side.error}")
    if overran:  # what the target held (its frames keep its model copy) goes back to the OS: the reference's
        traceback.clear_frames(side.error.__traceback__)  # growth is then its own
        return_freed_memory(0)
    model_mb = model_bytes(built.model) / 2**20
    t0 = time.perf_counter()
    try:
        measured = peak_growth() if overran else contextlib.nullcontext(lambda: None)  # the share, where needed
        with memory_allowance(tensor_bytes(side.actual)) as given, measured as grown:
            allowance["reference"] = given
            expected, cached = run_reference(case, built, config, ctx)
    except Exception as exc:  # noqa: BLE001
        evidence = {"error": traceback.format_exc(), REFERENCE_RAISED: one_line(exc)}
        if not overran and allocation_failure(f"{type(exc).__name__}: {exc}"):
            evidence[REFERENCE_OVERRAN] = True  # the target ran to the end under the cap: see runner.worker
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"fails on the reference: {one_line(exc)}",
                       evidence=evidence, timings=timings), None
    timings["reference"] = time.perf_counter() - t0
    del built

    evidence: dict[str, Any] = {"config": str(config)}
    if any(allowance.values()):
        evidence["memory_allowance_mb"] = {k: round(v / 2**20, 1) for k, v in allowance.items()}
    if overran and grown() is not None:
        # The target overran the cap; the reference then ran to the end beside what was left: it fits alone, and
        # its share (the model it trains in place, and what it grew by) is known without a probe (runner.worker).
        evidence[REFERENCE_SHARE_MB] = model_mb + grown()
    side.host.record(evidence)
    if side.peak_memory is not None:
        evidence["peak_device_memory_bytes"] = side.peak_memory
    if side.error is not None:
        evidence["error"] = traceback.format_exception_only(type(side.error), side.error)[-1].strip()
        return Outcome(case_id=case.id, status=classify_error(side.error), message=one_line(side.error),
                       evidence=evidence, timings=timings, cached_reference=cached), None
    if side.compiled is not None:
        evidence["compiled_graphs"] = side.compiled.graphs
        if ran_eagerly(side.compiled):  # never a pass: the compiler was not tested
            return Outcome(case_id=case.id, status=Status.ERROR, message=f"harness error: {EAGER_UNDER_COMPILE}",
                           evidence={**evidence, "harness_error": True}, timings=timings,
                           cached_reference=cached), None

    # The comparison holds both sides' results, which the phases above were each given room for: it gets them
    # on top of the cap too, so only its own temporaries (and a golden rerun's model) count against it.
    t0 = time.perf_counter()
    with memory_allowance(tensor_bytes(side.actual) + tensor_bytes(expected)) as given:
        verdict, precision = judge_case(case, config, side.actual, expected, target, reference, replay=replay)
    timings["comparison"] = time.perf_counter() - t0
    if given:
        evidence.setdefault("memory_allowance_mb", {})["comparison"] = round(given / 2**20, 1)
    outcome = verdict_outcome(case, verdict, precision, side, expected, evidence, timings)
    outcome.cached_reference = cached
    return outcome, verdict


def larger_inputs(config) -> list:
    """Inputs to judge an ill-conditioned configuration on, cheapest first: ``CONDITIONING_BATCH`` times its batch
    (batch norm over more values per channel), then that batch at the entry's next larger size, where the entry
    lists one (larger feature maps: more values per channel where a network pools a small image down to one)."""
    from . import registry

    wider = config.replace(batch=config.batch * CONDITIONING_BATCH)
    sizes = [s for s in registry.get_entry(config.arch).sizes if s > config.size]
    return [wider] + ([wider.replace(size=sizes[0])] if sizes else [])


def _elements(config) -> int:
    """The elements of a configuration's input, as its batch and size scale them (an image's side squared)."""
    return config.batch * config.size ** 2


# Verdicts a larger input can give the case: the judge decided the values (or the target ran on the host).
DECIDED = (Status.PASS, Status.MISMATCH, Status.CPU_FALLBACK)
# A larger input is tried only while the case's own run has used at most this share of its timeout, and the next
# one only where the last one's cost, scaled by the elements of its input, fits within this share of it: a larger
# input never turns an inconclusive case into a timeout.
LARGER_INPUT_START = 0.4
LARGER_INPUT_BUDGET = 0.8


def judged_on_larger_input(case: Case, config, outcome: Outcome, ctx) -> Outcome:
    """The verdict on the first of :func:`larger_inputs` that the judge can decide, in place of ``outcome`` (an
    ill-conditioned ``inconclusive``), saying so; ``outcome`` itself, with what each larger input gave, where none
    can be decided. Each larger input is judged without the op replay: the case's own input had it (every op agreed)."""
    from . import build

    floor = outcome.evidence.get("noise_floor", {})
    own = (f"batch {config.batch}, size {config.size} is ill-conditioned under the device's precision (condition "
           f"estimate {floor.get('condition', float('nan')):.3g} at {floor.get('worst', '?')})")
    tried: list[dict] = []
    timings = dict(outcome.timings)
    timeout = getattr(ctx.settings, "timeout_s", None) or float("inf")
    spent = sum(timings.values())
    last: tuple[Any, float] | None = None  # the last larger input judged, and what it cost
    for larger in larger_inputs(config):
        estimate = 0.0 if last is None else last[1] * _elements(larger) / _elements(last[0])
        if (spent > LARGER_INPUT_START * timeout if last is None else
                spent + estimate > LARGER_INPUT_BUDGET * timeout):
            tried.append({"config": str(larger), "status": "skip",
                          "message": f"not tried: {spent:.0f} s spent of the case's {timeout:.0f} s timeout"
                                     + (f", about {estimate:.0f} s more needed" if last else "")})
            break
        return_freed_memory(0)  # what the case's own runs freed, back to the OS: the larger input needs the room
        t0 = time.perf_counter()
        step: dict[str, float] = {}
        try:
            built = build(larger)
            step["generation"] = time.perf_counter() - t0
            got, verdict = judge_built(model_case(larger), larger, built, ctx, timings=step, replay=False)
            del built
        except Exception as exc:  # noqa: BLE001 - a build refused, memory over the cap: never worse than inconclusive
            got, verdict = Outcome(case_id=case.id, status=Status.SKIP, message=one_line(exc)), None
        for key, value in step.items():
            timings[f"larger_input.{key}"] = timings.get(f"larger_input.{key}", 0.0) + value
        cost = time.perf_counter() - t0
        spent, last = spent + cost, (larger, cost)
        if got.status is not Status.PASS and allocation_failure(f"{got.message} {got.evidence.get('error', '')}"):
            # the larger input's own need, not the case's: the case is judged on its input, under the cap
            tried.append({"config": str(larger), "status": "skip", "message": "over the worker's memory cap"})
            break
        tried.append({"config": str(larger), "status": got.status.value, "message": got.message[:300],
                      **({"noise_floor": got.evidence["noise_floor"]} if "noise_floor" in got.evidence else {})})
        if got.status in DECIDED and verdict is not None and not verdict.ill_conditioned:
            evidence = {**got.evidence, "judged_on": {"config": larger.set_fields(), "batch": larger.batch,
                                                     "size": larger.size, "case_input": own, "tried": tried},
                        "case_noise_floor": floor, "case_op_replay": outcome.evidence.get("op_replay")}
            return Outcome(case_id=case.id, status=got.status, evidence=evidence, timings=timings,
                           message=f"judged on batch {larger.batch}, size {larger.size} (this configuration's "
                                   f"{own}; every op agreed alone): {got.message}")
    evidence = {**outcome.evidence, "larger_inputs": tried}
    also = "; ".join(f"{t['config']}: {t['status']}" for t in tried)
    return Outcome(case_id=case.id, status=outcome.status, evidence=evidence, timings=timings,
                   cached_reference=outcome.cached_reference,
                   message=f"{outcome.message}; no larger input could be judged either ({also})")


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
    # a case judged on a larger input (judged_on_larger_input) is reproduced on that input
    config_fields = (outcome.evidence.get("judged_on") or {}).get("config") or case.config
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

config = ModelConfig.from_dict(json.loads({json.dumps(json.dumps(config_fields))}))
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
