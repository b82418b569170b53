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
