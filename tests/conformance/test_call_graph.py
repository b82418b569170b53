"""A graph of calls built without dynamo computes what the calls compute eagerly, through the real backend.

The op suite hands a compile backend such graphs instead of tracing each sample's op with dynamo (which costs
about as much per op as the whole eager sample). The graph must be the one dynamo would build: the samples'
tensors as inputs, everything else constant, every returned tensor an output; an in-place call mutates its
input once; gradients flow through it; what it cannot say in advance raises, so that dynamo builds that one.
"""

from __future__ import annotations

import pytest
import torch

import emulator  # noqa: F401 - the emulated neuron device
from conformance.call_graph import UnbuildableCalls, call_graph
from conformance.target import resolve_target

DEVICE = "neuron"


@pytest.fixture(scope="module")
def target():
    return resolve_target("neuron:compile")


def _eager(calls):
    return [fn(*args, **kwargs) for fn, args, kwargs in calls]


def test_outputs_of_every_structure_match_the_eager_calls(target):
    x = torch.randn(4, 5, device=DEVICE)
    y = torch.randn(5, device=DEVICE)
    calls = [(torch.max, (x, 1), {}),  # a named tuple of values and indices
             (torch.split, (x, 2), {}),  # a tuple of tensors
             (torch.add, (x, y), {"alpha": 2}),  # broadcasting, a constant keyword
             (torch.mul, (x, x), {}),  # one tensor passed twice
             (torch.nn.functional.softmax, (x,), {"dim": -1, "dtype": torch.float64}),
             (torch.Tensor.__getitem__, (x, (slice(1, 3), Ellipsis)), {}),
             (torch.clamp, (x,), {"min": float("-inf"), "max": 0.5}),
             (lambda t, dim: {"sum": t.sum(dim), "is_float": t.is_floating_point()}, (x,), {"dim": 0})]
    compiled = target.compile_calls(calls)
    assert compiled.graphs == 1
    assert len(compiled.graph.inputs) == 2, "each tensor is one graph input, however often it is passed"
    got, expected = compiled(), _eager(calls)
    assert type(got[0]) is type(expected[0]) and isinstance(got[1], tuple) and len(got[1]) == len(expected[1])
    assert got[7]["is_float"] is True
    torch.testing.assert_close(got, expected)


def test_an_in_place_call_mutates_its_input_once(target):
    x = torch.randn(3, 4, device=DEVICE)
    expected = torch.tanh(x)  # the device's own tanh, once
    (out,) = target.compile_calls([(torch.Tensor.tanh_, (x,), {})])()
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, expected)


def test_gradients_flow_through_the_compiled_graph(target):
    x = torch.randn(3, 4, device=DEVICE, requires_grad=True)
    w = torch.randn(4, 2, device=DEVICE, requires_grad=True)
    (out,) = target.compile_calls([(torch.mm, (x, w), {})])()
    grads = torch.autograd.grad(out.sum(), (x, w))
    x_ref, w_ref = x.detach().cpu().requires_grad_(), w.detach().cpu().requires_grad_()
    expected = torch.autograd.grad((x_ref @ w_ref).sum(), (x_ref, w_ref))
    torch.testing.assert_close([g.cpu() for g in grads], list(expected))


def test_a_compile_only_fault_shows_in_the_graph(target):
    """The backend compiles the graph for real: a fault that lives only in compiled graphs strikes there."""
    x = torch.rand(64, device=DEVICE) + 0.5
    emulator.set_faults("perturb@aten::tanh,mode=compile,rel=0.05")
    try:
        (out,) = target.compile_calls([(torch.tanh, (x,), {})])()
        eager = torch.tanh(x)
    finally:
        emulator.set_faults("")
    assert not torch.allclose(out.cpu(), eager.cpu(), rtol=1e-3), "the compiled graph ran the faulty compiled op"
    assert torch.allclose(eager.cpu(), torch.tanh(x.cpu()), rtol=1e-3), "eager code is not faulted"


def test_an_output_that_depends_on_the_data_cannot_be_built_directly():
    """nonzero's shape depends on its values: no graph can be built before it runs, so dynamo builds it."""
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device=DEVICE)
    with pytest.raises(Exception):
        call_graph([(torch.nonzero, (x,), {})])


def test_the_calls_that_cannot_be_built_are_named():
    """The calls whose outputs depend on their data are named, so that the others still go in one graph."""
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device=DEVICE)
    with pytest.raises(UnbuildableCalls) as raised:
        call_graph([(torch.tanh, (x,), {}), (torch.nonzero, (x,), {}), (torch.exp, (x,), {}),
                    (torch.masked_select, (x, x > 0), {})])
    assert raised.value.indices == [1, 3]


def test_a_batch_splits_off_the_samples_it_cannot_build_to_dynamo_without_bisecting(target):
    """narrow with a tensor ``start`` has a data-dependent output: those samples go to dynamo one by one, the
    ones with an int ``start`` stay in a graph built directly, and nothing is bisected."""
    from op_tests.rules import rule_for
    from op_tests.run import fresh_leaves, run_compiled_batch, target_inputs
    from op_tests.samples import sample_parts
    from op_tests.sources import get_op, op_key

    op = get_op("narrow")
    every = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    by_start = [[s for s in every if isinstance(s.args[1], torch.Tensor) == tensor] for tensor in (False, True)]
    samples = by_start[0][:4] + by_start[1][:2] + by_start[0][4:6]  # dynamo's samples cost ~1 s each
    tensor_start = [i for i, s in enumerate(samples) if isinstance(s.args[1], torch.Tensor)]
    assert tensor_start and len(tensor_start) < len(samples)
    parts = {i: target_inputs(fresh_leaves(sample_parts(s)), DEVICE) for i, s in enumerate(samples)}
    results, report = run_compiled_batch(op, rule_for(op_key(op)), samples, parts, backward=False, target=target,
                                         seeds={i: 0 for i in parts})
    assert report.bisected == 0 and report.direct >= 1
    assert sorted(report.alone) == tensor_start, "the unbuildable samples, and only they, went to dynamo alone"
    assert all(results[i].value is not None and results[i].direct for i in parts if i not in tensor_start)
