"""The execution trace is read from its node heads, copies whole: the same nodes as decoding all of it."""

from __future__ import annotations

import json

import torch

from conformance.host_copies import trace_nodes


def test_trace_nodes_read_as_the_whole_trace_decoded(tmp_path):
    from torch.profiler import ExecutionTraceObserver

    path = tmp_path / "trace.json"
    observer = ExecutionTraceObserver().register_callback(str(path))
    observer.start()
    x = torch.randn(4, 3, requires_grad=True)
    (torch.tanh(x).to(torch.float64).sum() + x.clone().sum()).backward()
    observer.stop()
    observer.unregister_callback()
    text = path.read_text()
    whole = json.loads(text)["nodes"]
    fast = trace_nodes(text)
    assert [(n["id"], n["name"], n["ctrl_deps"]) for n in fast] == [(n["id"], n["name"], n["ctrl_deps"]) for n in whole]
    copies = [(f, w) for f, w in zip(fast, whole) if f["name"] == "aten::copy_"]
    assert copies and all(f["inputs"]["values"] == w["inputs"]["values"] for f, w in copies)
    # Laid out otherwise (keys in another order): decoded whole, the same nodes.
    other = json.dumps({"nodes": [{"name": n["name"], **n} for n in whole]})
    assert trace_nodes(other) == whole


def _host_region():
    """Host copies of every kind the watch tells apart, forward and backward (the device's autograd thread):
    sin computed on the host by a kernel (copies inside aten::sin), explicit transfers, a scalar read, a copy
    within the device."""
    import emulator

    emulator.register()
    lib = torch.library.Library("aten", "IMPL")
    sin = torch.ops.aten.sin.default
    lib.impl("sin", lambda x: sin(x.cpu()).to(x.device), "PrivateUse1")
    try:
        x = torch.randn(5, 3, device="neuron", requires_grad=True)
        y = torch.sin(x) * 2
        (y.sum() + torch.cos(x).sum()).backward()  # cos's gradient is -sin: on the host again, on autograd's thread
        y.detach().cpu()
        y.sum().item()
        x.detach().t().contiguous()
    finally:
        del lib


def test_the_recorder_sees_the_copies_the_execution_trace_sees():
    """The C++ recorder keeps a fraction of the nodes; the ops it charges with host copies are the ones the
    whole execution trace gives, forward and backward, and what does not count (transfers, scalar reads)
    does not count in either."""
    from conformance.host_copies import _recorder, host_executed_ops, recording

    assert _recorder() is not None, "the package is built with its recorder (pip install -e . builds it)"
    found = {}
    for execution_trace in (False, True):
        with recording(execution_trace=execution_trace) as nodes:
            _host_region()
        found[execution_trace] = (host_executed_ops(nodes), len(nodes))
    (fast, recorded), (slow, traced) = found[False], found[True]
    assert fast == slow
    assert set(fast) == {"aten::sin"} and fast["aten::sin"] >= 4, fast
    assert recorded < traced / 2, (recorded, traced)


def test_the_recorder_keeps_nothing_from_a_region_without_copies_across_devices():
    from conformance.host_copies import recording

    with recording() as nodes:
        x = torch.randn(4, 4)
        x.t().contiguous().add_(1)
    assert nodes == []
