"""Runs one operator case: every sample of one op x dtype x direction, on the
reference and on the target, judged by the one judge (diff.judge).

One job a module: one side's run of a sample and compiled batches (run.py), a
sample's verdict (judging.py), the case's outcome and its cause (aggregate.py,
causes.py), the poison fences of the CPU's second run (fences.py), the watch on
the target's random stream (draws.py); here, the case's steps, the reference
cache, the case's journal, the probe and the reproducer.

Per sample, in order: inputs are generated on the CPU with the case's seed (or,
with the reference outputs, come from the reference cache) and copied to the
target with the same layout; the reference runs (or comes from the reference
cache); the target runs inside op tracking; outputs (forward) or input
gradients for a seeded random cotangent (backward) go to the judge, which
asks for the float64 golden and a second reference run only for a sample that
does not match at once.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from conformance.case import Case
from conformance.host_copies import HostCopies, watch_host_copies
from conformance.journal import CPU, CaseJournal
from conformance.outcome import Outcome, Status
from diff.precision import model_for
from diff.sides import to_device
from runner.executors import Executor
from runner.worker import CRASH_DIR_ENV

from .strategies import StrategyNotApplicable
from .repro import write_repro
from .rules import resolved_for_device, rule_for
from .samples import (
    HypothesisNotApplicable,
    cacheable_inputs,
    generate_samples,
    generator_digest,
    inputs_fingerprint,
    restore_samples,
    sample_parts,
)
from .aggregate import aggregate, name_the_cause
from .draws import DrawWatch
from .fences import fenced, poison_free_memory
from .judging import GOLDEN_DTYPES, SampleVerdict, check_sample, judge_sample, sample_judge, tolerances
from .run import BatchReport, SampleRun, fresh_leaves, run_compiled_batch, run_op, target_inputs
from .sources import case_op, op_db, op_key, sample_seed


# ---------------------------------------------------------------- the case


@dataclass
class _Timer:
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, start: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start


@dataclass(slots=True)
class _Prepared:
    """A sample ready for the target: the inputs generated on the CPU, the target's copies of them (made once the
    CPU's own step is over) and the reference's run."""

    index: int
    sample: Any
    seed: int
    generated: Any
    ref: SampleRun
    target_parts: Any = None


@dataclass(slots=True)
class _Judged:
    """What the case's samples added up to, for aggregate()."""

    verdicts: list[SampleVerdict] = field(default_factory=list)
    worst: dict[str, float] = field(default_factory=dict)
    nondeterministic: list[int] = field(default_factory=list)
    compiled_graphs: list[int] = field(default_factory=list)  # compile targets: graphs per sample


def execute_op_case(case: Case, ctx) -> Outcome:
    """Samples (generated, or from the reference cache), the reference side, the target side (compiled together
    under a compile target), each sample judged, then the case's outcome."""
    op = case_op(case)
    rule = rule_for(op_key(op))
    target = ctx.target  # the reference is the CPU: op samples are made there and run there
    backward = case.mode == "backward"
    timer = _Timer()

    t0 = time.perf_counter()
    found = _case_samples(case, op, ctx)
    if isinstance(found, Outcome):
        return found
    samples, entry, cache_ok = found
    timer.add("generation", t0)
    cache_ok, cached, fingerprint = _cached_reference(ctx, entry, samples, cache_ok)
    tolerance = tolerances().for_dtype(op_key(op), scope="op")
    precision = model_for(target)
    # The case's journal (conformance/journal.py): a worker that dies in a step of the CPU's own is the CPU's crash
    # (a skip); under a compile target, one that dies compiling a batch costs that batch's samples, not the case.
    journal = CaseJournal(os.environ.get(CRASH_DIR_ENV), case.id)
    journal.end()  # a step left in flight by an earlier run of the case is not this run's
    sides = _Sides(op=op, rule=rule, samples=samples, backward=backward, target=target, timer=timer, journal=journal,
                   # Host<->device copies need a device to copy from; the execution trace cannot record sparse tensors.
                   watch=target.device.type != "cpu" and not _has_sparse(samples))
    compiler_before = _compiler_stats(target)
    judged = _Judged()
    with target.track_ops() as tracker:
        prepared, fresh_reference = sides.run_reference(case, cached if cache_ok else None)
        sides.copy_inputs(prepared)
        compiled, batch, drew_in_batch = sides.run_compiled(prepared)
        for p in prepared:
            tgt, drew = sides.run_target(p, compiled, drew_in_batch)
            t0 = time.perf_counter()
            sides.judge(p, tgt, drew, compiled, batch, judged, tolerance=tolerance, precision=precision)
            timer.add("comparison", t0)

    if ctx.cache is not None and not cache_ok and fresh_reference:
        _store_reference(ctx, case, samples, fingerprint, fresh_reference)
    outcome = aggregate(case, judged.verdicts, judged.worst, tracker.trace, timer.totals, rule, judged.nondeterministic,
                        cached=cache_ok, host=sides.host, precision=precision)
    name_the_cause(case, outcome, samples, judged.verdicts)
    if judged.compiled_graphs:
        outcome.evidence["compiled_graphs"] = judged.compiled_graphs
    journal.close()
    if target.compiles:
        outcome.evidence["compile"] = batch.to_dict()
        after = _compiler_stats(target)
        if after is not None and compiler_before is not None:  # the emulated compiler: what it compiled, reused
            outcome.evidence["compile"]["compiler"] = {k: after[k] - compiler_before[k] for k in after}
    return outcome


@dataclass(slots=True, kw_only=True)
class _Sides:
    """The case's steps on each side, in the order execute_op_case takes them, timed."""

    op: Any
    rule: Any
    samples: list
    backward: bool
    target: Any
    timer: _Timer
    watch: bool  # watch the target's runs for host<->device copies
    journal: CaseJournal
    host: HostCopies = field(default_factory=HostCopies)

    def run_reference(self, case: Case, cached: list | None) -> tuple[list[_Prepared], list]:
        """Every sample's inputs and its reference run (from the cache's entries when ``cached``); the CPU's own
        step in the journal. Returns the prepared samples and the fresh reference results to cache."""
        prepared, fresh_reference = [], []
        if cached is None:
            self.journal.begin(list(range(len(self.samples))), CPU)
        for i, sample in enumerate(self.samples):
            seed = sample_seed(case, i)
            t0 = time.perf_counter()
            generated = sample_parts(sample)
            parts = fresh_leaves(generated)  # the reference's inputs
            self.timer.add("generation", t0)

            t0 = time.perf_counter()
            if cached is not None:
                entry = cached[i]
                ref = SampleRun(value=entry.get("value"), error=entry.get("error"), error_type=entry.get("error_type"),
                                skipped=entry.get("skipped"))
            else:
                ref = run_op(self.op, self.rule, sample, parts, backward=self.backward, device="cpu", seed=seed)
                fresh_reference.append({"value": ref.value, "error": ref.error, "error_type": ref.error_type,
                                        "skipped": ref.skipped})
            self.timer.add("reference", t0)
            prepared.append(_Prepared(index=i, sample=sample, seed=seed, generated=generated, ref=ref))
        self.journal.end()
        return prepared, fresh_reference

    def copy_inputs(self, prepared: list[_Prepared]) -> None:
        """The target's copies of the inputs, once the CPU's own step is over."""
        t0 = time.perf_counter()
        for p in prepared:
            p.target_parts = target_inputs(p.generated, self.target.device, self.rule.cpu_arguments)
        self.timer.add("generation", t0)

    def run_compiled(self, prepared: list[_Prepared]) -> tuple[dict[int, SampleRun], BatchReport, bool]:
        """Under a compile target, the samples the reference runs, compiled together (op_tests/run.py): their runs,
        the batches' report, and whether the batches drew on the target's own random stream."""
        if not self.target.compiles:
            return {}, BatchReport(), False
        t0 = time.perf_counter()
        runnable = {p.index: p.target_parts for p in prepared if p.ref.error is None and not p.ref.skipped}
        with watch_host_copies(self.watch, allowed=len(self.rule.cpu_arguments)) as seen, \
                DrawWatch(self.target.own_random_stream) as drew:
            compiled, batch = run_compiled_batch(self.op, self.rule, self.samples, runnable, backward=self.backward,
                                                 target=self.target, seeds={p.index: p.seed for p in prepared},
                                                 journal=self.journal)
        self.host.add(seen)
        self.timer.add("target", t0)
        return compiled, batch, bool(drew)

    def run_target(self, p: _Prepared, compiled: dict[int, SampleRun], drew_in_batch: bool) -> tuple[SampleRun, bool]:
        """The sample's run on the target (eager here; a compile target's from its batch), and whether it drew on
        the target's own random stream."""
        if self.target.compiles:
            return compiled.get(p.index) or SampleRun(), drew_in_batch  # not run: the reference fails or skips it
        t0 = time.perf_counter()
        with watch_host_copies(self.watch, allowed=len(self.rule.cpu_arguments)) as seen, \
                DrawWatch(self.target.own_random_stream) as watched:
            tgt = run_op(self.op, self.rule, p.sample, p.target_parts, backward=self.backward,
                         device=self.target.device, seed=p.seed)
            self.target.synchronize()
        self.host.add(seen)
        self.timer.add("target", t0)
        return tgt, bool(watched)

    def judge(self, p: _Prepared, tgt: SampleRun, drew: bool, compiled: dict[int, SampleRun], batch: BatchReport,
              judged: _Judged, *, tolerance, precision) -> None:
        """The sample's verdict (a sample failing in a compiled batch confirmed alone), added to ``judged``."""
        rule = self.rule
        # A sample that drew random numbers on the target's own stream (dropout inside attention, random
        # pooling regions) cannot match the CPU's draws value for value: judged by distribution.
        sample_rule = dataclasses.replace(rule, compare="distribution") if drew and rule.compare == "values" else rule
        judge = sample_judge(tolerance, sample_rule, p.target_parts, self.target.device, precision)
        verdict = judge_sample(p.index, self.op, rule, p.sample, p.generated, p.ref, tgt, backward=self.backward,
                               seed=p.seed, judge=judge, nondeterministic=judged.nondeterministic,
                               journal=self.journal)
        if p.index in compiled and p.index not in batch.alone and verdict.status not in (Status.PASS, Status.SKIP):
            self.journal.begin([p.index])
            verdict = _alone(self.op, rule, p.sample, p.generated, p.ref, verdict, i=p.index, seed=p.seed,
                             backward=self.backward, target=self.target, judge=judge,
                             nondeterministic=judged.nondeterministic, direct=compiled[p.index].direct)
            self.journal.end()
        if p.sample.name and verdict.status not in (Status.PASS, Status.SKIP):
            verdict.message = f"{verdict.message} [{p.sample.name}]"
        if verdict.comparison:
            for k, v in verdict.comparison.get("worst", {}).items():
                judged.worst[k] = max(judged.worst.get(k, 0.0), v)
        judged.verdicts.append(verdict)
        if tgt.graphs is not None:
            judged.compiled_graphs.append(tgt.graphs)


# ---------------------------------------------------------------- samples and the reference cache
def _case_samples(case: Case, op, ctx) -> tuple[list, Any, bool] | Outcome:
    """The case's samples, from the reference cache (with their reference outputs) or generated; a skip when
    there are none to run. Returns (samples, the cache's entry, whether inputs and outputs came from it)."""
    entry = ctx.cache.get(case.id) if ctx.cache is not None else None
    samples = restore_samples(entry)
    if samples is not None:  # inputs and reference outputs both from the cache: nothing to generate
        return samples, entry, True
    try:
        samples = generate_samples(op, case)
    except HypothesisNotApplicable as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"hypothesis examples do not apply: {exc}")
    except StrategyNotApplicable as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"input strategy does not apply: {exc}")
    except Exception as exc:  # noqa: BLE001
        return Outcome(case_id=case.id, status=Status.SKIP,
                       message=f"sample generation failed: {type(exc).__name__}: {exc}".splitlines()[0],
                       evidence={"error": traceback.format_exc()})
    if not samples:
        return Outcome(case_id=case.id, status=Status.SKIP, message="the op has no samples for this dtype")
    return resolved_for_device(op_key(op), samples, ctx.target.device.type), entry, False


def _cached_reference(ctx, entry, samples, cache_ok: bool) -> tuple[bool, list | None, str]:
    """(whether the reference outputs come from the cache, those outputs, the inputs' fingerprint): an entry
    without its inputs is used when the freshly generated inputs have its fingerprint."""
    fingerprint = inputs_fingerprint(samples) if ctx.cache is not None and not cache_ok else ""
    cache_ok = cache_ok or (isinstance(entry, dict) and entry.get("fingerprint") == fingerprint
                            and len(entry.get("samples", [])) == len(samples))
    return cache_ok, entry["samples"] if cache_ok else None, fingerprint


def _store_reference(ctx, case: Case, samples, fingerprint: str, fresh_reference: list) -> None:
    entry = {"fingerprint": fingerprint, "samples": fresh_reference}
    inputs = cacheable_inputs(samples)
    # With its inputs a warm run skips generation too; an entry too large with them is kept without.
    if inputs is None or not ctx.cache.put(case.id, {**entry, "generator": generator_digest(), "inputs": inputs}):
        ctx.cache.put(case.id, entry)


def _compiler_stats(target) -> dict | None:
    """The emulated compiler's counts of graphs compiled and reused, and its latency so far (compile targets)."""
    if not (target.compiles and target.is_emulated):
        return None
    from emulator.compile_backend import compile_stats

    return dict(compile_stats)


def _alone(op, rule, sample, generated, ref, verdict: SampleVerdict, *, i: int, seed: int, backward: bool, target,
           judge, nondeterministic: list[int], direct: bool = False) -> SampleVerdict:
    """A sample that failed in a graph of many, or in a graph built without dynamo (``direct``), compiled alone
    through dynamo, as a user's torch.compile would: the smallest graph that shows the failure is its evidence
    (and its reproducer's); one that passes alone keeps the batch's verdict, said so."""
    target_parts = target_inputs(generated, target.device, rule.cpu_arguments)
    tgt = run_op(op, rule, sample, target_parts, backward=backward, device=target.device, seed=seed,
                 prepare=target.prepare)
    target.synchronize()
    alone = judge_sample(i, op, rule, sample, generated, ref, tgt, backward=backward, seed=seed, judge=judge,
                         nondeterministic=nondeterministic)
    if alone.status not in (Status.PASS, Status.SKIP):
        alone.message = f"{alone.message} (also in a graph of its own)"
        return alone
    alone_ran = ("dynamo cannot put it in a graph alone: it ran eagerly there" if tgt.graphs == 0 else
                 "dynamo's graph of it alone passes")
    where = (f"only in the graph built without dynamo, with any other samples of its batch; {alone_ran}" if direct
             else "only when compiled in one graph with the case's other samples")
    verdict.message = f"{verdict.message} ({where})"
    return verdict


def _has_sparse(samples) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout != torch.strided
               for sample in samples for t in tree_leaves(sample_parts(sample)))


def probe_op_reference(case: Case, ctx) -> None:
    """Runs only the CPU side of every sample, as the case runs it (after a crash or hang of the whole case): the
    reference, its float64 golden, and its second run on fenced inputs after freed memory was poisoned. A CPU
    kernel that dies only on the golden's dtype or on leftovers in memory dies here too."""
    op = case_op(case)
    rule = rule_for(op_key(op))
    backward = case.mode == "backward"
    for i, sample in enumerate(generate_samples(op, case)):
        generated, seed = sample_parts(sample), sample_seed(case, i)
        ref = run_op(op, rule, sample, fresh_leaves(generated), backward=backward, device="cpu", seed=seed)
        if ref.error is not None or ref.skipped:
            continue
        run_op(op, rule, sample, to_device(generated, "cpu", GOLDEN_DTYPES, same_layout=True), backward=backward,
               device="cpu", seed=seed)
        poison_free_memory(ref.value)
        run_op(op, rule, sample, fenced(to_device(generated, "cpu", same_layout=True)), backward=backward,
               device="cpu", seed=seed)


def write_op_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    """The reproducer (repro.py), its failing sample shrunk by running candidates as the case ran them."""
    return write_repro(case, outcome, ctx, check=check_sample)


EXECUTOR = Executor(kind="op", execute=execute_op_case, probe_reference=probe_op_reference,
                    write_repro=write_op_repro, warmup=op_db)
