"""Runs one operator case: every sample of one op x dtype x direction, on the
reference and on the target, compared with the float64 golden rule.

Per sample, in order: inputs are generated on the CPU with the case's seed (or,
with the reference outputs, come from the reference cache) and copied to the
target; the reference runs (or comes from the reference cache);
the target runs inside op tracking; outputs (forward) or input gradients for
a seeded random cotangent (backward) are compared. The float64 golden and a
second reference run are computed only for a sample that does not match at
once: the golden decides whether the target is merely more accurate than the
CPU, the second run whether the CPU itself is non-deterministic.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from conformance.case import Case
from conformance.outcome import Outcome, Status
from conformance.serialize import saves_exactly
from diff.compare import Comparison, compare
from diff.tolerances import TolerancePolicy

from .rules import OpRule, gather_index_output, rule_for
from .sources import get_op, op_key, to_dtype

MAX_REPORTED_FAILURES = 10
UNSUPPORTED_MARKERS = (
    "not implemented for",
    "not currently implemented",
    "could not run 'aten::",
    "is not supported",
    "notimplementederror",
    "is only supported on",
)

_policy: TolerancePolicy | None = None


def _tolerances() -> TolerancePolicy:
    global _policy
    if _policy is None:
        _policy = TolerancePolicy()
    return _policy


# ---------------------------------------------------------------- samples
def generate_samples(op, case: Case) -> list:
    """The case's samples, made on the CPU, deterministic for its seed.

    Samples are made on the CPU, not on the device under test: a device whose
    random or creation ops are broken must fail those ops' cases, not the
    generation of every other case. The reference inputs begin with the
    sample inputs.
    """
    if case.config.get("source") == "hypothesis":
        return hypothesis_samples(op, case)
    dtype = to_dtype(case.dtype)
    limit = int(case.config.get("max_samples", 0))
    torch.manual_seed(case.seed)
    samples = []
    for sample in op.reference_inputs("cpu", dtype, requires_grad=case.mode == "backward"):
        samples.append(sample)
        if limit and len(samples) >= limit:
            break
    return samples


def hypothesis_samples(op, case: Case) -> list:
    """Samples drawn from the strategies in op_tests/strategies.py; each sample's name is its spec's repr."""
    from torch.testing._internal.opinfo.core import SampleInput

    from .sources import elementwise_kind
    from .strategies import binary_specs, draw_examples, tensor_specs

    kind = elementwise_kind(op)
    strategy = tensor_specs(case.dtype) if kind == "unary" else binary_specs(case.dtype)
    backward = case.mode == "backward"
    # Extra arguments (mvlgamma's p, threshold's value, ...) come from the op's first OpInfo sample.
    torch.manual_seed(case.seed)
    template = next(iter(op.sample_inputs("cpu", to_dtype(case.dtype))), None)
    extra_args, extra_kwargs = (), {}
    if template is not None:
        own = 0 if kind == "unary" else 1  # binary ops: the first argument is the other operand
        extra_args = tuple(template.args[own:])
        extra_kwargs = dict(template.kwargs)
        if any(isinstance(v, torch.Tensor) for v in tree_leaves((extra_args, extra_kwargs))):
            raise HypothesisNotApplicable(f"{op_key(op)} needs tensor arguments the strategies do not make")

    def make(spec):
        t = spec.build()
        return t.detach().requires_grad_() if backward else t

    samples = []
    for example in draw_examples(strategy, int(case.config.get("examples", 16)), seed=case.seed):
        if kind == "unary":
            samples.append(SampleInput(make(example), args=extra_args, kwargs=extra_kwargs, name=repr(example)))
        else:
            samples.append(SampleInput(make(example[0]), args=(make(example[1]), *extra_args), kwargs=extra_kwargs,
                                       name=repr(example)))
    return samples


class HypothesisNotApplicable(ValueError):
    """The op needs arguments the hypothesis strategies do not generate."""


# ---------------------------------------------------------------- samples from the reference cache
_DEFAULT_OUTPUT_PROCESS = "SampleInput.__init__.<locals>.<lambda>"  # OpInfo's identity default
_generator_digest: str | None = None


def generator_digest() -> str:
    """A hash of the code that makes samples: cached inputs are reused only while it is unchanged."""
    global _generator_digest
    if _generator_digest is None:
        import hashlib
        from pathlib import Path

        h = hashlib.blake2b(digest_size=16)
        for name in ("execute.py", "sources.py", "strategies.py"):
            h.update(Path(__file__).with_name(name).read_bytes())
        _generator_digest = h.hexdigest()
    return _generator_digest


def cacheable_inputs(samples) -> list | None:
    """The samples as plain values the reference cache can store, or None when they cannot be rebuilt from it.

    A sample whose output needs its own processing function, or whose
    inputs are not plain dense tensors (each saved with its storage, offset
    and strides, see ``serialize.saves_exactly``) and simple values, is
    generated anew on every run instead.
    """
    out = []
    for sample in samples:
        if getattr(sample.output_process_fn_grad, "__qualname__", "") != _DEFAULT_OUTPUT_PROCESS:
            return None
        inp, args, kwargs = sample_parts(sample)
        for leaf in tree_leaves((inp, args, kwargs)):
            if isinstance(leaf, torch.Tensor) and (type(leaf) is not torch.Tensor or leaf.is_conj() or leaf.is_neg()
                                                   or not saves_exactly(leaf)):
                return None
        out.append({"input": inp, "args": list(args), "kwargs": kwargs, "name": sample.name})
    return out


def restore_samples(entry) -> list | None:
    """The samples stored in a reference-cache entry, when it holds them for the current sample code."""
    if not isinstance(entry, dict) or entry.get("generator") != generator_digest():
        return None
    inputs = entry.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != len(entry.get("samples", ())):
        return None
    from torch.testing._internal.opinfo.core import SampleInput

    return [SampleInput(s["input"], args=tuple(s["args"]), kwargs=dict(s["kwargs"]), name=s.get("name", ""))
            for s in inputs]


def sample_parts(sample) -> tuple[Any, tuple, dict]:
    return sample.input, tuple(sample.args), dict(sample.kwargs)


def same_layout_copy(t: torch.Tensor, device) -> torch.Tensor:
    """A copy on ``device`` with the same sizes, strides and storage offset.

    Kernels may take another code path for another layout (vectorised or not),
    and with extreme values that changes results, so the target must see the
    very layout the reference saw: non-contiguous, transposed, expanded or
    channels-last.
    """
    if t.layout != torch.strided:
        return t.to(device)
    if t.is_conj():
        return same_layout_copy(t.conj(), device).conj()
    if t.is_neg():
        return same_layout_copy(t._neg_view(), device)._neg_view()
    numel = t.untyped_storage().nbytes() // t.element_size()
    if numel == 0:
        return t.to(device)
    whole = torch.as_strided(t, (numel,), (1,), 0).to(device, copy=True)
    return whole.as_strided(t.size(), t.stride(), t.storage_offset())


def _copy_to(value, device, dtype_map: dict | None = None, *, from_type: str | None = None,
             keep_on_cpu: tuple[int, ...] = ()):
    """Fresh leaf tensors on ``device`` (with the same layout when the dtype is kept).

    Device arguments of the ``from_type`` device (``torch.device`` objects or
    strings like "cpu") are redirected to ``device`` as well, so that
    ``x.to("cpu")`` in a CPU-made sample becomes ``x.to("neuron")`` for the
    target. ``keep_on_cpu``: positions in the args tuple that an op's API
    wants on the CPU (see op_rules.json "cpu_arguments").
    """
    device = torch.device(device)
    if keep_on_cpu and isinstance(value, tuple) and len(value) == 3:
        inp, args, kwargs = value
        kept = {i: args[i] for i in keep_on_cpu if i < len(args)}
        moved = _copy_to((inp, tuple(a for i, a in enumerate(args) if i not in kept), kwargs), device, dtype_map,
                         from_type=from_type)
        rest = iter(moved[1])
        return moved[0], tuple(kept[i] if i in kept else next(rest) for i in range(len(args))), moved[2]

    def is_from_device(v) -> bool:
        if from_type is None:
            return False
        if isinstance(v, torch.device):
            return v.type == from_type
        if isinstance(v, str) and v.split(":")[0] == from_type:
            try:
                return torch.device(v).type == from_type
            except RuntimeError:
                return False
        return False

    def move(t):
        if is_from_device(t):
            return device if isinstance(t, torch.device) else str(device)
        if not isinstance(t, torch.Tensor):
            return t
        target_dtype = dtype_map.get(t.dtype, t.dtype) if dtype_map else t.dtype
        if target_dtype == t.dtype:
            out = same_layout_copy(t.detach(), device)
        else:
            out = t.detach().to(device=device, dtype=target_dtype)
        return out.requires_grad_(t.requires_grad) if (out.is_floating_point() or out.is_complex()) else out

    return tree_map(move, value)


def fresh_leaves(value):
    """Fresh leaf copies on each tensor's own device, so both sides start from identical autograd leaves.

    (Some OpInfo samples arrive as tensors whose recorded graph does not reach them.)
    """
    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        out = same_layout_copy(t.detach(), t.device)
        return out.requires_grad_(t.requires_grad) if (out.is_floating_point() or out.is_complex()) else out

    return tree_map(copy, value)


def inputs_fingerprint(samples) -> str:
    """A hash of every sample's values, so a cached reference is only reused for the very same inputs."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for sample in samples:
        for leaf in tree_leaves(sample_parts(sample)):
            if isinstance(leaf, torch.Tensor):
                t = leaf.detach().cpu()
                if t.layout != torch.strided:  # sparse: fingerprint its dense values
                    h.update(f"{t.layout}".encode())
                    t = t.to_dense()
                h.update(f"{t.dtype}{tuple(t.shape)}{t.stride()}".encode())
                if t.layout == torch.strided and t.numel():
                    flat = torch.empty(t.numel(), dtype=t.dtype)
                    flat.copy_(t.resolve_conj().resolve_neg().reshape(-1))
                    h.update(flat.view(torch.uint8).numpy().tobytes())
            else:
                h.update(repr(leaf).encode())
    return h.hexdigest()


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


# ---------------------------------------------------------------- running one side
@dataclass
class SideResult:
    value: Any = None  # processed outputs (forward) or gradients (backward), on the side's device
    error: str | None = None
    error_type: str | None = None
    skipped: str | None = None  # why this sample cannot be judged


def _cotangents(outputs: list[torch.Tensor], seed: int, device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    cots = []
    for o in outputs:
        c = torch.randn(o.shape, generator=gen, dtype=torch.float64)
        if o.is_complex():
            c = torch.complex(c, torch.randn(o.shape, generator=gen, dtype=torch.float64))
        cots.append(c.to(dtype=o.dtype).to(device))
    return cots


def run_side(op, rule: OpRule, sample, parts, *, backward: bool, device, seed: int, prepare=None) -> SideResult:
    """Runs the op on one side; ``parts`` are that side's (input, args, kwargs)."""
    inp, args, kwargs = parts
    fn = op if prepare is None else prepare(lambda i, *a, **k: op(i, *a, **k))
    try:
        out = fn(inp, *args, **kwargs)
        out = sample.output_process_fn_grad(out)
        if rule.gather is not None and not backward:
            cpu_input = inp if isinstance(inp, torch.Tensor) else None
            if cpu_input is not None:
                out = gather_index_output(rule.gather, cpu_input.detach().cpu(), args, kwargs, out)
        if not backward:
            return SideResult(value=out)
        diff_inputs = [t for t in tree_leaves(parts) if isinstance(t, torch.Tensor) and t.requires_grad]
        diff_outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not diff_inputs or not diff_outputs:
            return SideResult(skipped="no differentiable inputs or outputs")
        grads = torch.autograd.grad(
            diff_outputs, diff_inputs, _cotangents(diff_outputs, seed, device), allow_unused=True
        )
        return SideResult(value=list(grads))
    except Exception as exc:  # noqa: BLE001 - any failure of the op is a finding
        text = f"{type(exc).__name__}: {exc}"
        return SideResult(error=text.strip(), error_type=type(exc).__name__)


def classify_error(text: str, error_type: str | None) -> Status:
    lowered = text.lower()
    if error_type == "NotImplementedError" or any(m in lowered for m in UNSUPPORTED_MARKERS):
        return Status.UNSUPPORTED
    return Status.ERROR


# ---------------------------------------------------------------- the case
@dataclass
class SampleVerdict:
    index: int
    status: Status
    message: str = ""
    comparison: dict | None = None


@dataclass
class _Timer:
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, start: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + time.perf_counter() - start


def execute_op_case(case: Case, ctx) -> Outcome:
    op = get_op(f"{case.name}.{case.family}" if case.family else case.name)
    key = op_key(op)
    rule = rule_for(key)
    target, reference = ctx.target, ctx.reference
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
    verdicts: list[SampleVerdict] = []
    worst: dict[str, float] = {}
    nondeterministic: list[int] = []
    device_type = target.device.type

    with target.track_ops() as tracker:
        for i, sample in enumerate(samples):
            seed = case.seed * 100_003 + i
            t0 = time.perf_counter()
            generated = sample_parts(sample)
            parts = fresh_leaves(generated)  # the reference's inputs
            target_parts = _copy_to(generated, target.device, from_type="cpu", keep_on_cpu=rule.cpu_arguments)
            timer.add("generation", t0)

            t0 = time.perf_counter()
            if cache_ok:
                entry = cached[i]
                ref = SideResult(value=entry.get("value"), error=entry.get("error"), error_type=entry.get("error_type"),
                                 skipped=entry.get("skipped"))
            else:
                ref = run_side(op, rule, sample, parts, backward=backward, device="cpu", seed=seed)
                fresh_reference.append({"value": ref.value, "error": ref.error, "error_type": ref.error_type,
                                        "skipped": ref.skipped})
            timer.add("reference", t0)

            t0 = time.perf_counter()
            tgt = run_side(op, rule, sample, target_parts, backward=backward, device=target.device, seed=seed,
                           prepare=target.prepare if target.compiles else None)
            target.synchronize()
            timer.add("target", t0)

            t0 = time.perf_counter()
            expected_device = device_type if _expects_device(target_parts, target.device) else None
            verdict = _judge(i, op, rule, sample, parts, ref, tgt, backward=backward, seed=seed,
                             tolerance=tolerance, device_type=expected_device, nondeterministic=nondeterministic)
            if sample.name and verdict.status not in (Status.PASS, Status.SKIP):
                verdict.message = f"{verdict.message} [{sample.name}]"
            if verdict.comparison:
                for k, v in verdict.comparison.get("worst", {}).items():
                    worst[k] = max(worst.get(k, 0.0), v)
            verdicts.append(verdict)
            timer.add("comparison", t0)

    if ctx.cache is not None and not cache_ok and fresh_reference:
        entry = {"fingerprint": fingerprint, "samples": fresh_reference}
        inputs = cacheable_inputs(samples)
        # With its inputs a warm run skips generation too; an entry too large with them is kept without.
        if inputs is None or not ctx.cache.put(case.id, {**entry, "generator": generator_digest(), "inputs": inputs}):
            ctx.cache.put(case.id, entry)
    trace = tracker.trace
    return _aggregate(case, verdicts, worst, trace, timer.totals, rule, nondeterministic, cached=cache_ok)


def _judge(i, op, rule, sample, parts, ref: SideResult, tgt: SideResult, *, backward, seed, tolerance, device_type,
           nondeterministic) -> SampleVerdict:
    if ref.skipped or tgt.skipped:
        return SampleVerdict(index=i, status=Status.SKIP, message=ref.skipped or tgt.skipped)
    if ref.error is not None:
        return SampleVerdict(index=i, status=Status.SKIP, message=f"fails on the reference: {ref.error.splitlines()[0]}")
    if tgt.error is not None:
        return SampleVerdict(index=i, status=classify_error(tgt.error, tgt.error_type), message=tgt.error.splitlines()[0])
    mode = rule.compare
    result = compare(tgt.value, ref.value, tolerance=tolerance, device=device_type, rule=mode)
    if not result and all(m.kind in ("values", "nonfinite") for m in result.mismatches):
        golden = run_side(op, rule, sample, _copy_to(parts, "cpu", GOLDEN_DTYPES), backward=backward, device="cpu",
                          seed=seed)
        if golden.error is None and golden.value is not None:
            result = compare(tgt.value, ref.value, golden=golden.value, tolerance=tolerance, device=device_type, rule=mode)
        if not result:
            _poison_free_memory(ref.value)
            again = run_side(op, rule, sample, _copy_to(parts, "cpu"), backward=backward, device="cpu", seed=seed)
            if again.error is None and not compare(again.value, ref.value, rule="values", tolerance=tolerance):
                # The CPU does not agree with itself: only metadata can be judged.
                nondeterministic.append(i)
                result = compare(tgt.value, ref.value, tolerance=tolerance, device=device_type, rule="metadata")
    if result:
        return SampleVerdict(index=i, status=Status.PASS, comparison=result.to_dict())
    return SampleVerdict(index=i, status=Status.MISMATCH, message=result.summary(), comparison=result.to_dict())


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


SEVERITY = (Status.MISMATCH, Status.ERROR, Status.UNSUPPORTED)


def _aggregate(case, verdicts, worst, trace, timings, rule, nondeterministic, *, cached) -> Outcome:
    by_status: dict[str, int] = {}
    for v in verdicts:
        by_status[v.status.value] = by_status.get(v.status.value, 0) + 1
    failures = [v for v in verdicts if v.status not in (Status.PASS, Status.SKIP)]
    evidence: dict[str, Any] = {
        "samples": len(verdicts),
        "by_status": by_status,
        "metrics": worst,
        "rule": rule.compare if not rule.gather else "gather_indices",
        "failures": [
            {"sample": v.index, "status": v.status.value, "message": v.message,
             "mismatches": (v.comparison or {}).get("mismatches", [])[:3]}
            for v in failures[:MAX_REPORTED_FAILURES]
        ],
    }
    if nondeterministic:
        evidence["nondeterministic_reference_samples"] = nondeterministic
    if trace is not None:
        evidence["fallback_ops"] = list(trace.fallback)
        evidence["executed_ops"] = list(trace.executed)
    status = Status.PASS
    message = f"{by_status.get('pass', 0)} / {len(verdicts)} samples match"
    for s in SEVERITY:
        hits = [v for v in failures if v.status is s]
        if hits:
            status = s
            message = f"sample {hits[0].index}: {hits[0].message}"
            if len(hits) > 1:
                message += f" (+{len(hits) - 1} more samples)"
            if s is not Status.MISMATCH:
                evidence["error"] = hits[0].message
            break
    else:
        if not by_status.get("pass"):
            status = Status.SKIP
            reasons = sorted({v.message for v in verdicts})
            message = f"no sample could be judged: {reasons[0]}" if reasons else "no samples"
        elif trace is not None and trace.fallback:
            status = Status.CPU_FALLBACK
            message = f"numerically right, but ran on the host: {', '.join(trace.fallback[:4])}"
    if nondeterministic and status in (Status.PASS, Status.CPU_FALLBACK):
        message += (f" ({len(nondeterministic)} compared by metadata only: the CPU reference does not reproduce "
                    "its own result for them)")
    if status is Status.MISMATCH and trace is not None and trace.fallback:
        message += f" [host fallback: {', '.join(trace.fallback[:3])}]"
    return Outcome(case_id=case.id, status=status, message=message, evidence=evidence, timings=timings,
                   cached_reference=cached)


def probe_op_reference(case: Case, ctx) -> None:
    """Runs only the reference side of every sample (after a crash or hang of the whole case)."""
    op = get_op(f"{case.name}.{case.family}" if case.family else case.name)
    rule = rule_for(op_key(op))
    for i, sample in enumerate(generate_samples(op, case)):
        run_side(op, rule, sample, fresh_leaves(sample_parts(sample)), backward=case.mode == "backward",
                 device="cpu", seed=case.seed * 100_003 + i)


def write_op_repro(case: Case, outcome: Outcome, ctx) -> str | None:
    from .repro import write_repro

    return write_repro(case, outcome, ctx)
