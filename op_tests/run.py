"""One side of an op sample: its inputs on the side's device, the op run there, its output as compared.

Under a compile target the case's samples are compiled together (:func:`run_compiled_batch`): one graph
for many samples, since a real compiler takes seconds to minutes a graph. Each sample is still judged on
its own. The graph is built without dynamo where it can be (conformance/call_graph.py: the graph dynamo
would build, at a fraction of its cost), and holds every sample's op. Where it cannot be built, dynamo
builds it with ``fullgraph=True``, which proves the same (a graph break raises). A batch that fails to
compile or raises is bisected down to the samples responsible, each then compiled alone through dynamo, so
that no failure rests on a graph dynamo did not build; a batch that breaks dynamo's graph falls back to a
graph per sample, whole too (fullgraph): a sample dynamo cannot put in one graph ran its op, or part of it,
eagerly, and is a harness error, never a pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from conformance.call_graph import UnbuildableCalls
from conformance.journal import CaseJournal
from conformance.target import Compiled
from diff.sides import to_device

from .rules import PROPERTIES, OpRule, gather_index_output
from .samples import sample_variant

# ---------------------------------------------------------------- a side's inputs
def target_inputs(parts, device, keep_on_cpu: tuple[int, ...] = ()):
    """The sample's (input, args, kwargs) for the target: same layouts, device arguments redirected.

    ``x.to("cpu")`` in a sample made on the CPU becomes ``x.to("neuron")``;
    ``keep_on_cpu``: positions in the args that the op's API wants on the CPU
    (op_rules.json "cpu_arguments").
    """
    inp, args, kwargs = parts
    kept = {i: args[i] for i in keep_on_cpu if i < len(args)}
    moved = to_device((inp, tuple(a for i, a in enumerate(args) if i not in kept), kwargs), device,
                      same_layout=True, redirect="cpu")
    rest = iter(moved[1])
    return moved[0], tuple(kept[i] if i in kept else next(rest) for i in range(len(args))), moved[2]


def fresh_leaves(value):
    """Fresh leaf copies on each tensor's own device, so both sides start from identical autograd leaves.

    (Some OpInfo samples arrive as tensors whose recorded graph does not reach them.)
    """
    return to_device(value, None, same_layout=True)


# ---------------------------------------------------------------- running one side
@dataclass
class SampleRun:
    """One side's run of one sample: what it returned, or why it has nothing to compare."""

    value: Any = None  # processed outputs (forward) or gradients (backward), on the side's device
    error: str | None = None
    error_type: str | None = None
    skipped: str | None = None  # why this sample cannot be judged
    graphs: int | None = None  # compile targets: graphs compiled for this sample (0: it ran eagerly)
    crashed: str | None = None  # compile targets: the compiler killed the worker on this sample alone (the death)
    direct: bool = False  # compile targets: its graph was built without dynamo (conformance/call_graph.py)


def _cotangents(outputs: list[torch.Tensor], seed: int, device) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    cots = []
    for o in outputs:
        c = torch.randn(o.shape, generator=gen, dtype=torch.float64)
        if o.is_complex():
            c = torch.complex(c, torch.randn(o.shape, generator=gen, dtype=torch.float64))
        cots.append(c.to(dtype=o.dtype).to(device))
    return cots


def op_callable(op, variant: str = ""):
    """The op as a plain function (for torch.compile), or one of its variants (strategies/variants.py)."""
    if variant:
        from .strategies.variants import run_variant

        return lambda i, *a, **k: run_variant(op, variant, i, a, k)
    return lambda i, *a, **k: op(i, *a, **k)


def run_op(op, rule: OpRule, sample, parts, *, backward: bool, device, seed: int, prepare=None) -> SampleRun:
    """Runs the op (or the sample's variant of it) on one side; ``parts`` are that side's (input, args, kwargs)."""
    variant = sample_variant(sample)
    fn = op if prepare is None and not variant else op_callable(op, variant)
    fn = fn if prepare is None else prepare(fn)
    result = _run_op(fn, rule, sample, parts, backward=backward, device=device, seed=seed)
    if isinstance(fn, Compiled):
        result.graphs = fn.graphs
    return result


def _run_op(fn, rule: OpRule, sample, parts, *, backward: bool, device, seed: int) -> SampleRun:
    inp, args, kwargs = parts
    try:
        out = processed_output(fn(inp, *args, **kwargs), rule, sample, parts, backward=backward)
        if not backward:
            return SampleRun(value=out)
        diff_inputs, diff_outputs = differentiable(parts, out)
        if not diff_inputs or not diff_outputs:
            return SampleRun(skipped="no differentiable inputs or outputs")
        grads = torch.autograd.grad(
            diff_outputs, diff_inputs, _cotangents(diff_outputs, seed, device), allow_unused=True
        )
        return SampleRun(value=list(grads))
    except Exception as exc:  # noqa: BLE001 - any failure of the op is a finding
        return failed(exc)


def failed(exc: BaseException) -> SampleRun:
    text = f"{type(exc).__name__}: {exc}"
    return SampleRun(error=text.strip(), error_type=type(exc).__name__)


def processed_output(out, rule: OpRule, sample, parts, *, backward: bool):
    """The op's raw output as it is compared: the rule's property, or the sample's own processing."""
    inp, args, kwargs = parts
    if rule.property is not None:  # instead of the sample's own processing, which expects the raw output
        out = PROPERTIES[rule.property](out, inp, args, kwargs, rule.op_key)
    else:
        out = sample.output_process_fn_grad(out)
    if rule.gather is not None and not backward:
        cpu_input = inp if isinstance(inp, torch.Tensor) else None
        if cpu_input is not None:
            out = gather_index_output(rule.gather, cpu_input.detach().cpu(), args, kwargs, out)
    return out


def differentiable(parts, out) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(inputs, outputs) that take part in the backward comparison."""
    return ([t for t in tree_leaves(parts) if isinstance(t, torch.Tensor) and t.requires_grad],
            [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad])





# ---------------------------------------------------------------- samples compiled together
MAX_SAMPLES_PER_GRAPH = 48  # bounds a graph's size (and what one failure costs to bisect)


@dataclass
class BatchReport:
    """How a case's samples went through the compiler: the evidence that each did."""

    graphs: int = 0  # graphs compiled, all batches together
    batches: list[int] | None = None  # samples per batch that compiled whole (fullgraph)
    bisected: int = 0  # batches split because they failed to compile or raised
    alone: list[int] | None = None  # samples compiled in a graph of their own (graph breaks, bisection)
    fallback: str = ""  # why samples went to graphs of their own
    crashed: list[int] | None = None  # samples whose compilation alone killed the worker (conformance/journal.py)
    direct: int = 0  # graphs built without dynamo (conformance/call_graph.py), of ``graphs``
    deaths: int = 0  # worker deaths this case resumed past

    def to_dict(self) -> dict:
        return {"graphs": self.graphs, "batches": self.batches or [], "bisected": self.bisected,
                "alone": self.alone or [], "fallback": self.fallback, "crashed": self.crashed or [],
                "deaths": self.deaths, "direct": self.direct}


def run_compiled_batch(op, rule: OpRule, samples, parts: dict[int, Any], *, backward: bool, target,
                       seeds: dict[int, int], journal: CaseJournal | None = None
                       ) -> tuple[dict[int, SampleRun], BatchReport]:
    """The target side of the samples ``parts`` (index -> that side's inputs), compiled in batches.

    ``journal``: each batch is written there before it compiles. A batch that killed the worker (a compiler
    that segfaults) is split on the case's next run, down to the samples that kill it alone: each of those is
    a ``crash`` of its own (the supervisor reruns a case that died with a batch in flight)."""
    report = BatchReport(batches=[], alone=[], crashed=[])
    results: dict[int, SampleRun] = {}
    deaths = journal.crashed() if journal is not None else []
    report.deaths = len(deaths)
    for died, reason in deaths:
        if len(died) == 1 and died[0] in parts:
            i = died[0]
            results[i] = SampleRun(crashed=f"the compiler killed the worker ({reason}) on this sample in a graph "
                                            "of its own")
            report.crashed.append(i)
            report.alone.append(i)  # it was compiled in a graph of its own, and died there
    split = [set(died) for died, _ in deaths if len(died) > 1]
    order = [i for i in parts if i not in results]
    pending = [order[k:k + MAX_SAMPLES_PER_GRAPH] for k in range(0, len(order), MAX_SAMPLES_PER_GRAPH)]
    while pending:
        group = pending.pop(0)
        if len(group) > 1 and set(group) in split:  # this batch killed the worker before: halves
            report.bisected += 1
            half = len(group) // 2
            pending[:0] = [group[:half], group[half:]]
            continue
        if journal is not None:
            journal.begin(group)
        outcome = _compile_group(op, rule, samples, parts, group, backward=backward, target=target, seeds=seeds,
                                 dynamo=len(group) > 1)
        if len(group) == 1 and not isinstance(outcome, dict):
            # a graph of its own through dynamo, whole (fullgraph): a sample dynamo cannot graph whole ran
            i = group[0]  # its op, or part of it, eagerly, and is a harness error (graphs 0), never a pass
            results[i] = run_op(op, rule, samples[i], parts[i], backward=backward, device=target.device,
                                seed=seeds[i], prepare=lambda fn: target.compile(fn, fullgraph=True))
            if results[i].error_type in _graph_break_names():
                report.fallback = report.fallback or results[i].error.splitlines()[0][:300]
                results[i] = SampleRun(graphs=0)
            report.alone.append(i)
            report.graphs += results[i].graphs or 0
            outcome = None
        if journal is not None:
            journal.end()
        if outcome is None:
            continue
        if isinstance(outcome, dict):
            results.update(outcome)
            report.batches.append(len(group))
            report.graphs += next(iter(outcome.values())).graphs or 0
            if next(iter(outcome.values())).direct:
                report.direct += 1
        elif isinstance(outcome, UnbuildableCalls):  # samples whose outputs depend on their data: dynamo builds
            # each alone, the others go on in a graph of their own (no bisection: the build named them)
            report.fallback = report.fallback or str(outcome).splitlines()[0][:300]
            unbuildable = [group[k] for k in outcome.indices]
            rest = [i for i in group if i not in unbuildable]
            pending[:0] = [[i] for i in unbuildable] + ([rest] if rest else [])
        elif _graph_break(outcome):  # dynamo cannot put the op in one graph: a graph per sample says how many
            report.fallback = report.fallback or f"{type(outcome).__name__}: {str(outcome).splitlines()[0]}"[:300]
            pending[:0] = [[i] for i in group]
        else:  # a compiler error or a sample that raises: halves, down to the samples responsible
            report.bisected += 1
            half = len(group) // 2
            pending[:0] = [group[:half], group[half:]]
    return results, report


def _detached(parts):
    """The sample's inputs cut from autograd: a forward batch hands the compiler an inference graph."""
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, parts)


@functools.cache
def _graph_break_names() -> frozenset[str]:
    """The names of dynamo's exceptions for what it cannot put in a graph (as a failed run records them)."""
    import torch._dynamo.exc as dynamo_exc

    names, pending = set(), [dynamo_exc.Unsupported, dynamo_exc.UserError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending += cls.__subclasses__()
    return frozenset(names)


def _graph_break(exc: BaseException) -> bool:
    import torch._dynamo.exc as dynamo_exc

    return isinstance(exc, (dynamo_exc.Unsupported, dynamo_exc.UserError))


def _direct_batch(fns, inputs, target):
    """The batch compiled in a graph built without dynamo (conformance/call_graph.py), and its outputs or the
    exception it raised when run. (None, None) where that graph cannot be built or compiled: dynamo then builds
    it, before anything ran. A batch that raises is bisected down to samples in graphs of their own, which
    dynamo builds: no sample is failed on a graph dynamo did not build."""
    try:
        compiled = target.compile_calls([(fn, (inp, *args), kwargs) for fn, (inp, args, kwargs) in zip(fns, inputs)])
    except UnbuildableCalls as exc:  # the caller splits those calls off, to dynamo, and builds the rest
        return None, exc
    except Exception:  # noqa: BLE001 - dynamo builds this batch instead
        return None, None
    try:  # once run, in-place samples have changed their inputs: what fails now is bisected, never rerun here
        raw = compiled()
        target.synchronize()
    except Exception as exc:  # noqa: BLE001 - the caller bisects
        return compiled, exc
    return compiled, raw


def _compile_group(op, rule: OpRule, samples, parts: dict[int, Any], group: list[int], *, backward: bool, target,
                   seeds: dict[int, int], dynamo: bool = True) -> dict[int, SampleRun] | BaseException | None:
    """One graph for the group's samples (fullgraph), then each sample's output processed (and, backward,
    all gradients in one pass: the samples share no input). The exception when the batch fails. The graph is
    built directly where it can be (:func:`_direct_batch`), else by dynamo; ``dynamo=False``: None instead of
    dynamo's graph, or of a failure of the direct one (a lone sample then goes through dynamo on its own)."""
    # The samples' inputs go in as they are, nested: dynamo wraps them as graph inputs, and traces nothing but
    # the ops (unflattening them inside the traced function cost it as much as the ops themselves).
    fns = [op_callable(op, sample_variant(samples[i])) if sample_variant(samples[i]) else getattr(op, "op", op)
           for i in group]  # OpInfo.__call__ calls its op: the op itself is one frame fewer to trace
    inputs = [parts[i] if backward else _detached(parts[i]) for i in group]
    compiled, raw = _direct_batch(fns, inputs, target)
    direct = compiled is not None
    if isinstance(raw, Exception):  # it raised when run, or named calls it cannot build (UnbuildableCalls)
        return raw if dynamo else None
    if compiled is None and not dynamo:
        return None
    if compiled is None:  # dynamo builds the graph: what the direct graph cannot say, or what failed there
        def batch(all_parts):
            return [fn(inp, *args, **kwargs) for fn, (inp, args, kwargs) in zip(fns, all_parts)]

        compiled = target.compile(batch, fullgraph=True)
        try:
            raw = compiled(inputs)
            target.synchronize()
        except Exception as exc:  # noqa: BLE001 - the caller bisects or falls back
            return exc
    results: dict[int, SampleRun] = {}
    pending: list[tuple[int, list, list]] = []
    for i, out in zip(group, raw):
        try:
            value = processed_output(out, rule, samples[i], parts[i], backward=backward)
        except Exception as exc:  # noqa: BLE001 - any failure of the op is a finding
            results[i] = failed(exc)
            continue
        if not backward:
            results[i] = SampleRun(value=value)
            continue
        diff_inputs, diff_outputs = differentiable(parts[i], value)
        if not diff_inputs or not diff_outputs:
            results[i] = SampleRun(skipped="no differentiable inputs or outputs")
        else:
            pending.append((i, diff_inputs, diff_outputs))
    if pending:
        outputs = [o for _, _, outs in pending for o in outs]
        inputs = [x for _, ins, _ in pending for x in ins]
        cotangents = [c for i, _, outs in pending for c in _cotangents(outs, seeds[i], target.device)]
        try:
            grads = torch.autograd.grad(outputs, inputs, cotangents, allow_unused=True)
            target.synchronize()
        except Exception as exc:  # noqa: BLE001 - the backward graph failed: bisect like a forward failure
            return exc if dynamo else None
        taken = 0
        for i, ins, _ in pending:
            results[i] = SampleRun(value=list(grads[taken:taken + len(ins)]))
            taken += len(ins)
    for result in results.values():
        result.graphs, result.direct = compiled.graphs, direct
    return results
