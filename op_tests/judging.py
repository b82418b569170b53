"""One sample judged: its verdict from the one judge (diff/judge.py), with the float64 golden, the CPU's second
run on fenced inputs and the noise floor asked for only when the sample does not match at once; the CPU's own
reruns are journaled as the CPU's steps (conformance/journal.py)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves

from conformance.case import Case
from conformance.journal import CPU, CaseJournal
from conformance.outcome import Status
from conformance.target import EAGER_UNDER_COMPILE
from diff.judge import DRAW_RUNS, Judge, classify_error
from diff.precision import PrecisionModel, model_for, perturbed_runs
from diff.sides import to_device
from diff.tolerances import TolerancePolicy

from .draws import other_stream
from .fences import fenced, poison_free_memory
from .rules import OpRule, rule_for
from .run import SampleRun, fresh_leaves, run_op, target_inputs
from .samples import sample_parts, sample_variant
from .sources import op_key, sample_seed


GOLDEN_DTYPES = {
    torch.float16: torch.float64,
    torch.bfloat16: torch.float64,
    torch.float32: torch.float64,
    torch.complex32: torch.complex128,
    torch.complex64: torch.complex128,
}


@functools.cache
def tolerances() -> TolerancePolicy:
    return TolerancePolicy()


def expects_device(parts, device: torch.device) -> bool:
    """Whether outputs should land on ``device``: some input or the device argument is there."""
    leaves = tree_leaves(parts)
    return any(isinstance(t, torch.Tensor) and t.device.type == device.type for t in leaves) or any(
        isinstance(t, torch.device) and t.type == device.type for t in leaves
    ) or any(isinstance(t, str) and t.split(":")[0] == device.type for t in leaves)


@dataclass
class SampleVerdict:
    index: int
    status: Status
    message: str = ""
    comparison: dict | None = None
    noise: dict | None = None  # the noise-floor verdict (diff.precision), where the judge formed one


def sample_judge(tolerance, rule: OpRule, target_parts, device: torch.device, precision: PrecisionModel | None = None
           ) -> Judge:
    """The judge of one sample: outputs must land on the target when some input or device argument is there;
    the target's precision model gives the noise floor."""
    expected_device = device.type if expects_device(target_parts, device) else None
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
    judge = sample_judge(tolerances().for_dtype(key, scope="op"), rule, target_parts, target.device, model_for(target))
    return judge_sample(index, op, rule, sample, generated, ref, tgt, backward=backward, seed=seed, judge=judge,
                        nondeterministic=[])


def judge_sample(i, op, rule, sample, parts, ref: SampleRun, tgt: SampleRun, *, backward, seed, judge: Judge,
                 nondeterministic: list[int], journal: CaseJournal | None = None) -> SampleVerdict:
    """One sample's verdict. A sample the CPU reference cannot reproduce is judged by dtype, shape and device
    only (the judge's ``inconclusive``), and listed in the case's evidence.

    ``parts``: the sample as generated, never run (an in-place variant mutates the copies each side runs);
    the golden and the second reference run start from fresh copies of it. ``journal``: where the CPU's own
    reruns (golden, second run, noise floor, contiguous copy) are journaled as the CPU's steps."""
    cpu = CpuStep(journal, i)
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
        poison_free_memory(ref.value)
        again = run_op(op, rule, sample, fenced(to_device(parts, "cpu", same_layout=True)), backward=backward,
                       device="cpu", seed=seed)
        return again.value if again.error is None else None

    @cpu
    def perturbed():
        return [r for r in perturbed_runs(lambda: reference_value(op, rule, sample, parts, backward, seed),
                                          judge.precision, seed=seed) if r is not None]

    @cpu
    def other_streams():
        runs = []
        for k in range(1, DRAW_RUNS + 1):
            with other_stream(k):
                runs.append(reference_value(op, rule, sample, parts, backward, seed))
        return [r for r in runs if r is not None]

    verdict = judge(tgt.value, ref.value, golden=golden, reference_again=reference_again, noise=perturbed,
                    draws=other_streams)
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
    if verdict.status is Status.MISMATCH and has_views(parts) and not sample_variant(sample):
        contiguous = cpu(lambda: run_op(op, rule, sample, to_device(parts, "cpu"), backward=backward, device="cpu",
                                        seed=seed))()
        same = Judge(tolerance=judge.tolerance, rule=judge.rule)  # both on the CPU: no device to check
        if contiguous.error is None and not same(contiguous.value, ref.value):
            # The CPU's own answer changes with the layout of the same values: it is no reference here.
            return SampleVerdict(index=i, status=Status.SKIP,
                                 message="the CPU reference gives another result for the same values stored "
                                         "contiguously")
    message = verdict.message
    promoted = result_type_note(sample, parts, ref.value)
    return SampleVerdict(index=i, status=Status.MISMATCH, message=f"{message} {promoted}".strip(),
                         comparison=verdict.comparison.to_dict(), noise=noise)


class CpuStep:
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


def has_views(parts) -> bool:
    return any(isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() > 1
               and (not t.is_contiguous() or t.storage_offset() > 0) for t in tree_leaves(parts))


def reference_value(op, rule, sample, parts, backward: bool, seed: int):
    result = run_op(op, rule, sample, to_device(parts, "cpu", same_layout=True), backward=backward, device="cpu",
                    seed=seed)
    return result.value if result.error is None else None


def result_type_note(sample, parts, reference) -> str:
    """For operands of mixed dtypes: what ``torch.result_type`` says the result's dtype is."""
    from .strategies.mixed import expected_dtype

    if " with a " not in (sample.name or "") or not isinstance(reference, torch.Tensor):
        return ""
    expected = expected_dtype(parts)
    if expected is None:
        return ""
    agrees = "as the reference's" if expected == reference.dtype else f"the reference gives {reference.dtype}"
    return f"(torch.result_type gives {expected}, {agrees})"
