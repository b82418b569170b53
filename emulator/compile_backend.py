"""``torch.compile(backend="neuron")``.

With the emulated device, graphs are traced with AOTAutograd and run op by op
on the device, so the numerics profile applies inside compiled code too. Like
the real backend's compiled graphs, graph inputs of 64-bit types are narrowed
on the way in (int64 through int32, float64 through float32) when the profile
says so, each new input shape compiles a new graph, and dynamic shapes are
refused. Every compilation is recorded in :data:`compile_events`, so a
migration check can report recompilations and the shapes behind them.

The profile's compile latency (``compile_seconds_per_graph`` plus
``compile_seconds_per_node`` for each node) models a compiler as slow as
neuronx-cc, which takes seconds to minutes a graph. A graph already compiled
in the same build (the same code and input signature, found in the folder
named by NEURON_VALIDATE_COMPILE_CACHE, which the runner sets per build) costs
nothing again, as neuronx-cc's own compile cache would have it: reruns,
reproducer checks and shrinking reuse what the run compiled. Nothing is kept
across builds: each build has its own folder. :data:`compile_stats` counts
compilations and cache hits in this process.

Faults given with ``mode=compiler`` (emulator/faults.py) strike in the compiler itself, as it compiles a
graph that holds their op: it raises, dies (SIGSEGV, SIGABRT) or never returns, as a broken neuronx-cc would,
so that the harness's handling of a compiler that fails on one graph can be tested for real.

When torch_neuronx is installed this entry point hands the graph to the real
backend's own compiler instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class CompileEvent:
    """One graph compilation: the input signature that caused it."""

    graph_id: int
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    narrowed_inputs: tuple[int, ...]  # indices of 64-bit inputs narrowed on the way in


compile_events: list[CompileEvent] = []
narrowing_losses: list[str] = []  # one line per graph input whose values changed when narrowed
_lock = threading.Lock()
COMPILE_CACHE_ENV = "NEURON_VALIDATE_COMPILE_CACHE"
compile_stats = {"compiled": 0, "cached": 0, "seconds": 0.0}  # graphs this process compiled, reused; latency
_compiled_here: set[str] = set()


def _graph_key(graph: torch.fx.GraphModule, inputs) -> str:
    """What makes a compiled graph reusable: its code and its inputs' shapes, strides and dtypes."""
    signature = [(tuple(t.shape), tuple(t.stride()), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t)
                 for t in inputs]
    return hashlib.sha256((graph.code + repr(signature)).encode()).hexdigest()[:32]


def _compile_latency(graph: torch.fx.GraphModule, inputs) -> None:
    """Waits as long as the profile's compiler takes for this graph, unless this build compiled it before."""
    import emulator

    profile = emulator.profile()
    if not (profile.compile_seconds_per_graph or profile.compile_seconds_per_node):
        with _lock:
            compile_stats["compiled"] += 1
        return
    key = _graph_key(graph, inputs)
    folder = os.environ.get(COMPILE_CACHE_ENV)
    marker = Path(folder) / key if folder else None
    with _lock:
        seen = key in _compiled_here or (marker is not None and marker.exists())
        compile_stats["cached" if seen else "compiled"] += 1
    if seen:
        return
    seconds = profile.compile_seconds_per_graph + profile.compile_seconds_per_node * len(graph.graph.nodes)
    time.sleep(seconds)
    with _lock:
        compile_stats["seconds"] += seconds
        _compiled_here.add(key)
    if marker is not None:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:  # a read-only or vanished folder: this process still remembers it
            pass


class DynamicShapesUnsupported(RuntimeError):
    pass


def clear_compile_events() -> None:
    with _lock:
        compile_events.clear()
        narrowing_losses.clear()


def _narrow(value, index: int, graph_id: int):
    if not isinstance(value, torch.Tensor):
        return value
    if value.dtype == torch.int64:
        narrowed = value.to(torch.int32).to(torch.int64)
    elif value.dtype == torch.float64:
        narrowed = value.to(torch.float32).to(torch.float64)
    else:
        return value
    if not torch.equal(narrowed, value):
        with _lock:
            narrowing_losses.append(
                f"graph {graph_id} input {index} ({value.dtype}, shape {tuple(value.shape)}) changed when narrowed"
            )
    return narrowed


def _real_backend():
    """The torch_neuronx compiler registered under the same name, if any."""
    for ep in importlib.metadata.entry_points(group="torch_dynamo_backends", name="neuron"):
        if not ep.value.startswith(__name__):
            return ep.load()
    raise RuntimeError(
        "torch_neuronx is installed but registers no 'neuron' torch.compile backend that neuron-validate can find"
    )


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    import emulator

    if not emulator.is_registered():
        return _real_backend()(gm, example_inputs, **kwargs)

    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    # The device compiles one graph per input shape: no automatic dynamic dims.
    torch._dynamo.config.automatic_dynamic_shapes = False
    for value in example_inputs:
        if isinstance(value, torch.SymInt) or (
            isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)
        ):
            raise DynamicShapesUnsupported(
                "the neuron backend compiles static shapes only: dynamic=True is not supported"
            )
    narrow = emulator.profile().compile_downcast_64bit
    tensors = [v for v in example_inputs if isinstance(v, torch.Tensor)]
    with _lock:
        graph_id = len(compile_events)
        compile_events.append(
            CompileEvent(
                graph_id=graph_id,
                input_shapes=tuple(tuple(int(s) for s in t.shape) for t in tensors),
                input_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in tensors),
                narrowed_inputs=tuple(
                    i for i, t in enumerate(tensors) if narrow and t.dtype in (torch.int64, torch.float64)
                ),
            )
        )

    def compiler(graph: torch.fx.GraphModule, inputs, phase: str):
        _compiler_faults(graph, phase)
        _compile_latency(graph, inputs)

        def run(*args):
            if narrow:
                args = tuple(_narrow(a, i, graph_id) for i, a in enumerate(args))
            previous = torch.ops.neuron_emulator.set_in_compiled_graph(True)  # compile-only faults strike here
            try:
                return graph(*args)
            finally:
                torch.ops.neuron_emulator.set_in_compiled_graph(previous)

        return make_boxed_func(run)

    # The emulated compiler is not inductor and reads none of its settings. PyTorch's joint-graph passes do
    # read inductor's fallback_random (which the harness sets so that inductor leaves random ops to ATen):
    # under it they keep every op tagged random, and SDPA's kernel choice (_fused_sdp_choice, an int) then
    # stops the partitioner: "Expected _fused_sdp_choice to be a tensor" for any attention trained compiled.
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fallback_random=False):
        return aot_autograd(fw_compiler=lambda g, i: compiler(g, i, "forward"),
                            bw_compiler=lambda g, i: compiler(g, i, "backward"))(gm, example_inputs)


class CompilerError(RuntimeError):
    """The emulated compiler failed on a graph (a ``raise@OP,mode=compiler`` fault)."""


def _compiler_faults(graph: torch.fx.GraphModule, phase: str) -> None:
    """Strikes the ``mode=compiler`` faults whose op the graph holds (and whose phase and dtype match)."""
    import fnmatch

    import emulator
    from emulator.faults import host_kernel

    faults = [f for f in emulator.active_faults() if f.mode == "compiler" and f.phase in ("any", phase)]
    if not faults:
        return
    for node in graph.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "_schema"):
            continue
        name = node.target._schema.name  # "aten::tanh"
        for fault in faults:
            if fnmatch.fnmatchcase(name, fault.op) and (not fault.dtype or fault.dtype in _node_dtypes(node)):
                if fault.kind == "raise":
                    raise CompilerError(f"neuron compiler: internal error compiling {name} (injected fault)")
                host_kernel(fault.kind)()


def _node_dtypes(node) -> set[str]:
    """The dtypes of a graph node's tensor arguments ("float64" for a Python float: the dispatcher's own)."""
    from torch.utils._pytree import tree_leaves

    found = set()
    for arg in tree_leaves((node.args, node.kwargs)):
        value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg
        if isinstance(value, torch.Tensor):
            found.add(str(value.dtype).removeprefix("torch."))
        elif type(value) is float:
            found.add("float64")
    return found
