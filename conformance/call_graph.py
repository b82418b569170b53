"""A graph of calls built directly, for a compile backend, without dynamo.

What dynamo hands a backend for ``[op(*args) for each sample]`` is a graph whose inputs are the samples'
tensors, whose nodes call the ops with everything else as constants, and whose outputs are every tensor the
calls return. Dynamo pays for that graph op by op in its bytecode interpreter: about 10 ms an op, as much as
the eager sweep spends on a whole sample (reference, target and judge). The op suite's compiled samples are
known calls, not user code, so the same graph is built here directly (an FX node a call) and handed to the
backend as dynamo would hand it: the graph module and its real input tensors. The backend under test does
all it does for a dynamo graph: AOTAutograd, its decompositions, its own compiler.

The calls' output structure (a tuple of values and indices, a list of tensors) comes from running them once
on fake tensors, so that the graph returns a flat tuple of tensors (a backend takes nothing else), each
picked out by ``getitem``/``getattr`` nodes as dynamo would, and :meth:`CallGraph.unflatten` puts them back.
A call this cannot build (an output that fake tensors cannot say in advance, such as a data-dependent shape)
raises :class:`UnbuildableCalls` naming it, so that the caller can put the others in a graph and hand that one
to dynamo; anything else that fails to build (a constant FX cannot write into code) raises as it is.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import (GetAttrKey, MappingKey, SequenceKey, tree_flatten_with_path, tree_leaves, tree_map,
                                 tree_unflatten)

Call = tuple[Callable, tuple, dict]  # fn, args, kwargs: the tensors among them are the graph's inputs


@dataclass
class CallGraph:
    """The graph of some calls, its input tensors, and how its flat outputs go back into each call's output."""

    module: torch.fx.GraphModule
    inputs: list[torch.Tensor]
    fake_mode: Any  # the FakeTensorMode holding the inputs' fakes: the backend traces with it, as under dynamo
    _outputs: list[tuple[Any, list]]  # per call: its output's tree spec, and each leaf (an output's index, or
    #                                   the constant itself where the leaf is not a tensor)

    def unflatten(self, flat) -> list:
        """Each call's output, from what the compiled graph returned."""
        flat = list(flat)
        return [tree_unflatten([flat[leaf.index] if isinstance(leaf, _Output) else leaf for leaf in leaves], spec)
                for spec, leaves in self._outputs]


@dataclass(frozen=True, slots=True)
class _Output:
    index: int  # the position of a tensor leaf among the graph's outputs


def call_graph(calls: list[Call]) -> CallGraph:
    """The graph of ``calls``: one node a call, the tensors of their arguments as inputs (one input per
    tensor, however often it is passed), every tensor they return as an output."""
    graph = torch.fx.Graph()
    placeholders: dict[int, torch.fx.Node] = {}
    inputs: list[torch.Tensor] = []

    def lift(value):
        if isinstance(value, torch.Tensor):
            if id(value) not in placeholders:
                placeholders[id(value)] = graph.placeholder(f"arg{len(inputs)}")
                inputs.append(value)
            return placeholders[id(value)]
        return value

    lifted = [(fn, tree_map(lift, tuple(args)), tree_map(lift, dict(kwargs))) for fn, args, kwargs in calls]
    nodes = [graph.call_function(fn, args, kwargs) for fn, args, kwargs in lifted]
    results, outputs = [], []
    fake_mode = FakeTensorMode()
    for node, fake_out in zip(nodes, _fake_outputs(calls, inputs, fake_mode)):
        leaves_with_path, spec = tree_flatten_with_path(fake_out)
        leaves = []
        for path, leaf in leaves_with_path:
            if isinstance(leaf, torch.Tensor):
                leaves.append(_Output(len(results)))
                results.append(_picked(graph, node, path))
            else:
                leaves.append(leaf)
        outputs.append((spec, leaves))
    graph.output(tuple(results))
    return CallGraph(module=torch.fx.GraphModule(torch.nn.Module(), graph), inputs=inputs, fake_mode=fake_mode,
                     _outputs=outputs)


def _picked(graph: torch.fx.Graph, node: torch.fx.Node, path) -> torch.fx.Node:
    """The node of one leaf of a call's output: the getitem/getattr chain along its path."""
    for key in path:
        if isinstance(key, SequenceKey):
            node = graph.call_function(operator.getitem, (node, key.idx))
        elif isinstance(key, MappingKey):
            node = graph.call_function(operator.getitem, (node, key.key))
        elif isinstance(key, GetAttrKey):
            node = graph.call_function(getattr, (node, key.name))
        else:
            raise TypeError(f"an output reached by {key!r}: dynamo builds this graph")
    return node


class UnbuildableCalls(Exception):
    """Calls whose output cannot be said before they run (a shape or a number that depends on the data), by
    their positions: the others can still go in a graph of their own."""

    def __init__(self, indices: list[int], first: BaseException) -> None:
        super().__init__(f"{len(indices)} calls cannot be put in a graph built directly (call {indices[0]}: "
                         f"{type(first).__name__}: {first})")
        self.indices = indices


def _fake_outputs(calls: list[Call], inputs: list[torch.Tensor], mode) -> list:
    """Each call run once on fake tensors: the structure of what it returns. The inputs' fakes stay as made (the
    backend's trace reuses them); the calls run on copies with their sizes and strides, which in-place ops
    may change. Raises :class:`UnbuildableCalls` naming every call that cannot be run so."""
    fakes = {id(t): mode.from_tensor(t) for t in inputs}
    outputs, unbuildable, first = [], [], None
    with mode:
        copies = {key: _copy(fake) for key, fake in fakes.items()}
        swap = lambda v: copies[id(v)] if isinstance(v, torch.Tensor) else v  # noqa: E731
        for k, (fn, args, kwargs) in enumerate(calls):
            try:
                out = fn(*tree_map(swap, tuple(args)), **tree_map(swap, dict(kwargs)))
                if any(isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)) for leaf in tree_leaves(out)):
                    raise TypeError("the call returns a symbolic number")
                outputs.append(out)
            except Exception as exc:  # noqa: BLE001 - dynamo builds what fake tensors cannot run
                unbuildable.append(k)
                first = first or exc
    if unbuildable:
        raise UnbuildableCalls(unbuildable, first)
    return outputs


def _copy(fake: torch.Tensor) -> torch.Tensor:
    copy = torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device,
                               layout=fake.layout)
    return copy.requires_grad_(fake.requires_grad) if fake.requires_grad else copy
