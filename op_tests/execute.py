"""Runs one operator case: every sample of one op x dtype x direction, on the
reference and on the target, judged by the one judge (diff.judge).

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
import functools
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from conformance.case import Case
from conformance.host_copies import HostCopies, HostExecution, watch_host_copies
from conformance.journal import CPU, CaseJournal
from conformance.outcome import Outcome, Status
from conformance.target import EAGER_UNDER_COMPILE
from diff.judge import Judge, classify_error
from diff.precision import PrecisionModel, model_for, perturbed_runs
from diff.sides import to_device
from diff.tolerances import TolerancePolicy
from runner.executors import Executor
from runner.worker import CRASH_DIR_ENV

from .causes import case_cause, sample_facts
from .families import FamilyNotApplicable
from .repro import write_repro
from .rules import OpRule, rule_for
from .samples import (
    HypothesisNotApplicable,
    cacheable_inputs,
    generate_samples,
    generator_digest,
    inputs_fingerprint,
    restore_samples,
    sample_parts,
    sample_variant,
)
from .run import BatchReport, SideResult, fresh_leaves, run_compiled_batch, run_op, target_inputs
from .sources import case_op, op_db, op_key, sample_seed

MAX_REPORTED_FAILURES = 10


@functools.cache
def _tolerances() -> TolerancePolicy:
    return TolerancePolicy()


def _expects_device(parts, device: torch.device) -> bool:
    """Whether outputs should land on ``device``: some input or the device argument is there."""
    leaves = tree_leaves(parts)
    return any(isinstance(t, torch.Tensor) and t.device.type == device.type for t in leaves) or any(
        isinstance(t, torch.device) and t.type == device.type for t in leaves
    ) or any(isinstance(t, str) and t.split(":")[0] == device.type for t in leaves)


GOLDEN_DTYPES = {
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.float32: torch.float64,
    torch.complex32: torch.complex128,
    torch.complex64: torch.complex128,
}


# ---------------------------------------------------------------- the case
@dataclass
class SampleVerdict:
    index: int
    status: Status
    message: str = ""
    comparison: dict | None = None
    noise: dict | None = None  # the noise-floor verdict (diff.precision), where the judge formed one


@dataclass
class _Timer:
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, start: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start


def execute_op_case(case: Case, ctx) -> Outcome:
    op = case_op(case)
    key = op_key(op)
    rule = rule_for(key)
    target = ctx.target  # the reference is the CPU: op samples are made there and run there
    backward = case.mode == "backward"
    timer = _Timer()

    t0 = time.perf_counter()
    entry = ctx.cache.get(case.id) if ctx.cache is not None else None
    samples = restore_samples(entry)
    cache_ok = samples is not None  # inputs and reference outputs both from the cache: nothing to generate
    try:
        samples = samples if cache_ok else generate_samples(op, case)
    except HypothesisNotApplicable as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"hypothesis examples do not apply: {exc}")
    except FamilyNotApplicable as exc:
        return Outcome(case_id=case.id, status=Status.SKIP, message=f"input family does not apply: {exc}")
    except Exception as exc:  # noqa: BLE001
        return Outcome(case_id=case.id, status=Status.SKIP,
                       message=f"sample generation failed: {type(exc).__name__}: {exc}".splitlines()[0],
                       evidence={"error": traceback.format_exc()})
    timer.add("generation", t0)
    if not samples:
        return Outcome(case_id=case.id, status=Status.SKIP, message="the op has no samples for this dtype")

    fingerprint = inputs_fingerprint(samples) if ctx.cache is not None and not cache_ok else ""
    cache_ok = cache_ok or (isinstance(entry, dict) and entry.get("fingerprint") == fingerprint
                            and len(entry.get("samples", [])) == len(samples))
    cached = entry["samples"] if cache_ok else None
    fresh_reference: list = []
    tolerance = _tolerances().for_dtype(key, scope="op")
    precision = model_for(target)
    verdicts: list[SampleVerdict] = []
    worst: dict[str, float] = {}
    nondeterministic: list[int] = []
    compiled_graphs: list[int] = []  # compile targets: graphs per sample

    # Host<->device copies need a device to copy from; the execution trace cannot record sparse tensors.
    watch = target.device.type != "cpu" and not _has_sparse(samples)
    host = HostCopies()
    batch = BatchReport()
    compiler_before = _compiler_stats(target)
    # The case's journal (conformance/journal.py): a worker that dies in a step of the CPU's own is the CPU's crash
    # (a skip); under a compile target, one that dies compiling a batch costs that batch's samples, not the case.
    journal = CaseJournal(os.environ.get(CRASH_DIR_ENV), case.id)
    journal.end()  # a step left in flight by an earlier run of the case is not this run's
    with target.track_ops() as tracker:
        prepared = []  # [index, sample, seed, generated inputs, the target's inputs, reference result]
        if not cache_ok:
            journal.begin(list(range(len(samples))), CPU)
        for i, sample in enumerate(samples):
            seed = sample_seed(case, i)
            t0 = time.perf_counter()
            generated = sample_parts(sample)
            parts = fresh_leaves(generated)  # the reference's inputs
            timer.add("generation", t0)

            t0 = time.perf_counter()
            if cache_ok:
                entry = cached[i]
                ref = SideResult(value=entry.get("value"), error=entry.get("error"), error_type=entry.get("error_type"),
                                 skipped=entry.get("skipped"))
            else:
                ref = run_op(op, rule, sample, parts, backward=backward, device="cpu", seed=seed)
                fresh_reference.append({"value": ref.value, "error": ref.error, "error_type": ref.error_type,
                                        "skipped": ref.skipped})
            timer.add("reference", t0)
            prepared.append([i, sample, seed, generated, None, ref])
        journal.end()
        t0 = time.perf_counter()
        for entry in prepared:  # the target's copies of the inputs, once the CPU's own step is over
            entry[4] = target_inputs(entry[3], target.device, rule.cpu_arguments)
        timer.add("generation", t0)

        compiled: dict[int, SideResult] = {}
        drew_in_batch = False
        if target.compiles:  # the samples the reference runs, compiled together (op_tests/run.py)
            t0 = time.perf_counter()
            runnable = {i: tp for i, _, _, _, tp, ref in prepared if ref.error is None and not ref.skipped}
            with watch_host_copies(watch, allowed=len(rule.cpu_arguments)) as seen, \
                    DrawWatch(target.own_random_stream) as drew:
                compiled, batch = run_compiled_batch(op, rule, samples, runnable, backward=backward, target=target,
                                                     seeds={i: seed for i, _, seed, *_ in prepared},
                                                     journal=journal if target.compiles else None)
            host.add(seen)
            drew_in_batch = bool(drew)
            timer.add("target", t0)

        for i, sample, seed, generated, target_parts, ref in prepared:
            t0 = time.perf_counter()
            drew = drew_in_batch
            if target.compiles:
                tgt = compiled.get(i) or SideResult()  # not run: the reference fails or skips this sample
            else:
                with watch_host_copies(watch, allowed=len(rule.cpu_arguments)) as seen, \
                        DrawWatch(target.own_random_stream) as watched:
                    tgt = run_op(op, rule, sample, target_parts, backward=backward, device=target.device, seed=seed)
                    target.synchronize()
                host.add(seen)
                drew = bool(watched)
            timer.add("target", t0)

            t0 = time.perf_counter()
            # A sample that drew random numbers on the target's own stream (dropout inside attention, random
            # pooling regions) cannot match the CPU's draws value for value: judged by distribution.
            sample_rule = dataclasses.replace(rule, compare="distribution") if drew and rule.compare == "values" \
                else rule
            judge = _judge(tolerance, sample_rule, target_parts, target.device, precision)
            verdict = judge_sample(i, op, rule, sample, generated, ref, tgt, backward=backward, seed=seed,
                                   judge=judge, nondeterministic=nondeterministic, journal=journal)
            if i in compiled and i not in batch.alone and verdict.status not in (Status.PASS, Status.SKIP):
                journal.begin([i])
                verdict = _alone(op, rule, sample, generated, ref, verdict, i=i, seed=seed, backward=backward,
                                 target=target, judge=judge, nondeterministic=nondeterministic)
                journal.end()
            if sample.name and verdict.status not in (Status.PASS, Status.SKIP):
                verdict.message = f"{verdict.message} [{sample.name}]"
            if verdict.comparison:
                for k, v in verdict.comparison.get("worst", {}).items():
                    worst[k] = max(worst.get(k, 0.0), v)
            verdicts.append(verdict)
            if tgt.graphs is not None:
                compiled_graphs.append(tgt.graphs)
            timer.add("comparison", t0)

    if ctx.cache is not None and not cache_ok and fresh_reference:
        entry = {"fingerprint": fingerprint, "samples": fresh_reference}
        inputs = cacheable_inputs(samples)
        # With its inputs a warm run skips generation too; an entry too large with them is kept without.
        if inputs is None or not ctx.cache.put(case.id, {**entry, "generator": generator_digest(), "inputs": inputs}):
            ctx.cache.put(case.id, entry)
    trace = tracker.trace
    outcome = _aggregate(case, verdicts, worst, trace, timer.totals, rule, nondeterministic, cached=cache_ok,
                         host=host, precision=precision)
    _name_the_cause(case, outcome, samples, verdicts)
    if compiled_graphs:
        outcome.evidence["compiled_graphs"] = compiled_graphs
    journal.close()
    if target.compiles:
        outcome.evidence["compile"] = batch.to_dict()
        after = _compiler_stats(target)
        if after is not None and compiler_before is not None:  # the emulated compiler: what it compiled, reused
            outcome.evidence["compile"]["compiler"] = {k: after[k] - compiler_before[k] for k in after}
    return outcome


def _compiler_stats(target) -> dict | None:
    """The emulated compiler's counts of graphs compiled and reused, and its latency so far (compile targets)."""
    if not (target.compiles and target.is_emulated):
        return None
    from emulator.compile_backend import compile_stats

    return dict(compile_stats)


def _alone(op, rule, sample, generated, ref, verdict: SampleVerdict, *, i: int, seed: int, backward: bool, target,
           judge, nondeterministic: list[int]) -> SampleVerdict:
    """A sample that failed in a graph of many, compiled in a graph of its own: the smallest graph that shows
    the failure is its evidence (and its reproducer's); one that passes alone keeps the batch's verdict, said so."""
    target_parts = target_inputs(generated, target.device, rule.cpu_arguments)
    tgt = run_op(op, rule, sample, target_parts, backward=backward, device=target.device, seed=seed,
                 prepare=target.prepare)
    target.synchronize()
    alone = judge_sample(i, op, rule, sample, generated, ref, tgt, backward=backward, seed=seed, judge=judge,
                         nondeterministic=nondeterministic)
    if alone.status not in (Status.PASS, Status.SKIP):
        alone.message = f"{alone.message} (also in a graph of its own)"
        return alone
    verdict.message = f"{verdict.message} (only when compiled in one graph with the case's other samples)"
    return verdict



class DrawWatch:
    """Whether a run drew random numbers from ``module``'s generator (a device module, or None: never).

    The generator is seeded before the run and its state compared after. OpInfo's random ops reseed the
    same seed (``wrapper_set_seed``) and restore the state afterwards (``freeze_rng_state``), so the state
    is also compared whenever something restores it. Truthy after a run that drew."""

    SEED = 42  # wrapper_set_seed's

    def __init__(self, module) -> None:
        self.module, self.state, self.drew, self._restore = module, None, False, None

    def __enter__(self) -> "DrawWatch":
        if self.module is not None:
            self.module.manual_seed(self.SEED)
            self.state = self.module.get_rng_state().clone()
            self._restore = self.module.set_rng_state

            def set_rng_state(new_state, *args, **kwargs):
                self._check()
                return self._restore(new_state, *args, **kwargs)

            self.module.set_rng_state = set_rng_state
        return self

    def _check(self) -> None:
        if not self.drew and not torch.equal(self.state, self.module.get_rng_state()):
            self.drew = True

    def __exit__(self, *exc) -> None:
        if self.module is not None:
            self.module.set_rng_state = self._restore
            self._check()

    def __bool__(self) -> bool:
        return self.drew


def _judge(tolerance, rule: OpRule, target_parts, device: torch.device, precision: PrecisionModel | None = None
           ) -> Judge:
    """The judge of one sample: outputs must land on the target when some input or device argument is there;
    the target's precision model gives the noise floor."""
    expected_device = device.type if _expects_device(target_parts, device) else None
    return Judge(tolerance=tolerance, device=expected_device, rule=rule.compare, precision=precision)


def check_sample(op, case: Case, sample, index: int, target) -> SampleVerdict:
    """One sample run on both sides and judged, as the case runs it (without the cache, timers or the host-copy
    watch): the shrinker's question "does this smaller sample still fail?"."""
    key = op_key(op)
    rule = rule_for(key)
    backward = case.mode == "backward"
    seed = sample_seed(case, index)
    generated = sample_parts(sample)
    target_parts = target_inputs(generated, target.device, rule.cpu_arguments)
    ref = run_op(op, rule, sample, fresh_leaves(generated), backward=backward, device="cpu", seed=seed)
    tgt = run_op(op, rule, sample, target_parts, backward=backward, device=target.device, seed=seed,
                 prepare=target.prepare if target.compiles else None)
    target.synchronize()
    judge = _judge(_tolerances().for_dtype(key, scope="op"), rule, target_parts, target.device, model_for(target))
    return judge_sample(index, op, rule, sample, generated, ref, tgt, backward=backward, seed=seed, judge=judge,
                        nondeterministic=[])


def _has_sparse(samples) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout != torch.strided
               for sample in samples for t in tree_leaves(sample_parts(sample)))


def judge_sample(i, op, rule, sample, parts, ref: SideResult, tgt: SideResult, *, backward, seed, judge: Judge,
                 nondeterministic: list[int], journal: CaseJournal | None = None) -> SampleVerdict:
    """One sample's verdict. A sample the CPU reference cannot reproduce is judged by dtype, shape and device
    only (the judge's ``inconclusive``), and listed in the case's evidence.

    ``parts``: the sample as generated, never run (an in-place variant mutates the copies each side runs);
    the golden and the second reference run start from fresh copies of it. ``journal``: where the CPU's own
    reruns (golden, second run, noise floor, contiguous copy) are journaled as the CPU's steps."""
    cpu = _CpuStep(journal, i)
    if ref.skipped or tgt.skipped:
        return SampleVerdict(index=i, status=Status.SKIP, message=ref.skipped or tgt.skipped)
    if ref.error is not None:
        return SampleVerdict(index=i, status=Status.SKIP, message=f"fails on the reference: {ref.error.splitlines()[0]}")
    if tgt.crashed is not None:
        return SampleVerdict(index=i, status=Status.CRASH, message=tgt.crashed)
    if tgt.error is not None:
        return SampleVerdict(index=i, status=classify_error(tgt.error, tgt.error_type), message=tgt.error.splitlines()[0])
    if tgt.graphs == 0:  # never a pass: the compiler was not tested
        return SampleVerdict(index=i, status=Status.ERROR, message=f"harness error: {EAGER_UNDER_COMPILE}")

    @cpu
    def golden():
        result = run_op(op, rule, sample, to_device(parts, "cpu", GOLDEN_DTYPES, same_layout=True), backward=backward,
                        device="cpu", seed=seed)
        return result.value if result.error is None else None

    @cpu
    def reference_again():
        _poison_free_memory(ref.value)
        again = run_op(op, rule, sample, _fenced(to_device(parts, "cpu", same_layout=True)), backward=backward,
                       device="cpu", seed=seed)
        return again.value if again.error is None else None

    @cpu
    def perturbed():
        return [r for r in perturbed_runs(lambda: _reference_value(op, rule, sample, parts, backward, seed),
                                          judge.precision, seed=seed) if r is not None]

    verdict = judge(tgt.value, ref.value, golden=golden, reference_again=reference_again, noise=perturbed)
    noise = verdict.noise.to_dict() if verdict.noise is not None else None
    if verdict.status is Status.INCONCLUSIVE and verdict.nondeterministic:
        nondeterministic.append(i)
        return SampleVerdict(index=i, status=Status.PASS, comparison=verdict.comparison.to_dict())
    if verdict.status is Status.INCONCLUSIVE:  # the precision model leaves the reference no significant bit
        return SampleVerdict(index=i, status=Status.INCONCLUSIVE, message=verdict.message,
                             comparison=verdict.comparison.to_dict(), noise=noise)
    if verdict:
        return SampleVerdict(index=i, status=Status.PASS, comparison=verdict.comparison.to_dict(), noise=noise,
                             message=verdict.message if verdict.within_precision else "")
    if verdict.status is Status.MISMATCH and _has_views(parts) and not sample_variant(sample):
        contiguous = cpu(lambda: run_op(op, rule, sample, to_device(parts, "cpu"), backward=backward, device="cpu",
                                        seed=seed))()
        same = Judge(tolerance=judge.tolerance, rule=judge.rule)  # both on the CPU: no device to check
        if contiguous.error is None and not same(contiguous.value, ref.value):
            # The CPU's own answer changes with the layout of the same values: it is no reference here.
            return SampleVerdict(index=i, status=Status.SKIP,
                                 message="the CPU reference gives another result for the same values stored "
                                         "contiguously")
    message = verdict.message
    promoted = _result_type_note(sample, parts, ref.value)
    return SampleVerdict(index=i, status=Status.MISMATCH, message=f"{message} {promoted}".strip(),
                         comparison=verdict.comparison.to_dict(), noise=noise)


class _CpuStep:
    """Wraps a function of the CPU's own (a sample's golden or reruns) in a CPU step of the case's journal."""

    def __init__(self, journal: CaseJournal | None, index: int) -> None:
        self.journal, self.index = journal, index

    def __call__(self, fn):
        if self.journal is None:
            return fn

        def step(*args, **kwargs):
            self.journal.begin([self.index], CPU)
            try:
                return fn(*args, **kwargs)
            finally:
                self.journal.end()

        return step


def _has_views(parts) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() > 1
               and (not t.is_contiguous() or t.storage_offset() > 0) for t in tree_leaves(parts))


def _reference_value(op, rule, sample, parts, backward: bool, seed: int):
    result = run_op(op, rule, sample, to_device(parts, "cpu", same_layout=True), backward=backward, device="cpu",
                    seed=seed)
    return result.value if result.error is None else None


def _result_type_note(sample, parts, reference) -> str:
    """For operands of mixed dtypes: what ``torch.result_type`` says the result's dtype is."""
    from .families.mixed import expected_dtype

    if " with a " not in (sample.name or "") or not isinstance(reference, torch.Tensor):
        return ""
    expected = expected_dtype(parts)
    if expected is None:
        return ""
    agrees = "as the reference's" if expected == reference.dtype else f"the reference gives {reference.dtype}"
    return f"(torch.result_type gives {expected}, {agrees})"


def _name_the_cause(case: Case, outcome: Outcome, samples, verdicts: list[SampleVerdict]) -> None:
    """Names what the failing samples have in common (op_tests/causes.py) in the outcome's evidence."""
    if outcome.status in (Status.PASS, Status.SKIP):
        return
    judged = [v for v in verdicts if v.status is not Status.SKIP]
    family = case.config.get("inputs", "")
    facts = [sample_facts(samples[v.index], family, case.name) for v in judged]
    failed = [v.status is not Status.PASS for v in judged]
    if outcome.status is Status.CPU_FALLBACK:
        failed = [True] * len(judged)
    cause = case_cause(facts, failed)
    if cause is not None:
        outcome.evidence["cause"] = cause.to_dict()

FENCE = 256  # elements of poison after each input's storage in the second reference run


def _fenced(parts):
    """The inputs again, each storage followed by poison.

    A kernel that reads past its input's storage (seen with stride-0,
    expanded inputs) reads whatever lies there; in two reference runs in a row
    that is usually the same, so the reference looks deterministic while the
    target, with other neighbours, differs. With poison after the storage,
    such a kernel shows up as a reference that does not reproduce itself.
    """
    from torch.utils._pytree import tree_map

    def fence(t):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_conj() or t.is_neg() or not t.numel():
            return t
        n = t.untyped_storage().nbytes() // t.element_size()
        poison = True if t.dtype == torch.bool else 77 if not (t.is_floating_point() or t.is_complex()) else 1.2345e4
        buf = torch.full((n + FENCE,), poison, dtype=t.dtype)
        buf[:n].copy_(torch.as_strided(t.detach(), (n,), (1,), 0))
        out = buf.as_strided(t.size(), t.stride(), t.storage_offset())
        return out.requires_grad_(t.requires_grad) if t.requires_grad else out

    return tree_map(fence, parts)


def _poison_free_memory(like) -> None:
    """Fills, then frees, blocks the size of the reference's outputs before the second reference run.

    A kernel that leaves part of its output unwritten returns whatever the
    allocator hands back; two runs in a row usually get the same block with
    the same leftovers and would agree. With the blocks poisoned, such a
    kernel shows up as non-deterministic instead of as a target mismatch.
    """
    blocks = [torch.full(t.shape, 1.2345e4, dtype=t.dtype) if t.is_floating_point() else torch.full(t.shape, 77, dtype=t.dtype)
              for t in tree_leaves(like) if isinstance(t, torch.Tensor) and t.layout == torch.strided
              and not t.is_complex() and t.dtype != torch.bool]
    del blocks


SEVERITY = (Status.CRASH, Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED, Status.INCONCLUSIVE)


def _aggregate(case, verdicts, worst, trace, timings, rule, nondeterministic, *, cached, host: HostCopies,
               precision: PrecisionModel | None = None) -> Outcome:
    """The case's outcome from its samples' verdicts. Host execution comes from two independent sources:
    the backend's own tracking (``trace.fallback``) and host<->device copies seen inside an op (``host``)."""
    by_status: dict[str, int] = {}
    for v in verdicts:
        by_status[v.status.value] = by_status.get(v.status.value, 0) + 1
    failures = [v for v in verdicts if v.status not in (Status.PASS, Status.SKIP)]
    evidence: dict[str, Any] = {
        "samples": len(verdicts),
        "by_status": by_status,
        "sample_statuses": [v.status.value for v in verdicts],  # in sample order
        "metrics": worst,
        "rule": rule.property or (rule.compare if not rule.gather else "gather_indices"),
        "failures": [
            {"sample": v.index, "status": v.status.value, "message": v.message,
             "mismatches": (v.comparison or {}).get("mismatches", [])[:3]}
            for v in failures[:MAX_REPORTED_FAILURES]
        ],
    }
    if nondeterministic:
        evidence["nondeterministic_reference_samples"] = nondeterministic
    within = [v for v in verdicts if v.status is Status.PASS and v.noise is not None]
    if precision:
        evidence["precision_model"] = precision.to_dict()
    if within:
        worst_bits = min(within, key=lambda v: v.noise["bits_kept"] - v.noise["bits_expected"])
        evidence["within_precision"] = {"samples": len(within), "model": precision.summary if precision else "",
                                        "worst": worst_bits.noise}
    skipped = sorted({v.message for v in verdicts if v.status is Status.SKIP})
    if skipped:
        evidence["skipped_samples"] = skipped[:3]  # why some samples could not be judged
    on_host = HostExecution(trace, host)
    on_host.record(evidence)
    status = Status.PASS
    message = f"{by_status.get('pass', 0)} / {len(verdicts)} samples match"
    for s in SEVERITY:
        hits = [v for v in failures if v.status is s]
        if hits:
            status = s
            message = f"sample {hits[0].index}: {hits[0].message}"
            if len(hits) > 1:
                message += f" (+{len(hits) - 1} more samples)"
            if s not in (Status.MISMATCH, Status.INCONCLUSIVE):
                evidence["error"] = hits[0].message
            break
    else:
        if not by_status.get("pass"):
            status = Status.SKIP
            reasons = sorted({v.message for v in verdicts})
            message = f"no sample could be judged: {reasons[0]}" if reasons else "no samples"
        elif on_host.ops:
            status = Status.CPU_FALLBACK
            message = on_host.fallback_message()
    if within and status in (Status.PASS, Status.CPU_FALLBACK):
        message += f"; {len(within)} of them {worst_bits.message}"
    if nondeterministic and status in (Status.PASS, Status.CPU_FALLBACK):
        message += (f" ({len(nondeterministic)} compared by metadata only: the CPU reference does not reproduce "
                    "its own result for them)")
    if status is Status.MISMATCH:
        message += on_host.mismatch_note()
    return Outcome(case_id=case.id, status=status, message=message, evidence=evidence, timings=timings,
                   cached_reference=cached)


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
        _poison_free_memory(ref.value)
        run_op(op, rule, sample, _fenced(to_device(generated, "cpu", same_layout=True)), backward=backward,
               device="cpu", seed=seed)


def write_op_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    """The reproducer (repro.py), its failing sample shrunk by running candidates as the case ran them."""
    return write_repro(case, outcome, ctx, check=check_sample)


EXECUTOR = Executor(kind="op", execute=execute_op_case, probe_reference=probe_op_reference,
                    write_repro=write_op_repro, warmup=op_db)
