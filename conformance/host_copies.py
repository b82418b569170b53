"""Host execution seen from the outside: host<->device copies nested inside an op's execution.

A backend that computes an op on the host copies the op's inputs off the
device and its outputs back. Whether the backend's own tracking owns up to
it or not, those copies run through the dispatcher inside the op's call. A
PyTorch execution trace (``torch.profiler.ExecutionTraceObserver``) records
every dispatched op with its parent and, unlike the profiler's event list,
the device of every tensor argument; the watch's own recorder (C++, a
RecordFunction callback) keeps only the copies that cross devices and the
calls above them, the same nodes at a fraction of the cost. A ``copy_`` / ``_copy_from`` between
the CPU and another device, below a compute op, is host execution. An
explicit transfer (``tensor.cpu()``, the harness moving results) has only
movement ops above the copy, and a scalar read (``item()``) is a host read
by definition; neither counts. A copy within one device (a conjugate's
materialisation) is not a host copy, nor is one PyTorch's own composite
decomposition makes (ctc_loss reads its lengths on the host, on every
backend). A kernel that copies with its runtime's own memcpy (CUDA's size
reads in ``nonzero``) does not go through the dispatcher and is not seen.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterator

WATCH_ENV = "NEURON_VALIDATE_HOST_COPY_WATCH"  # "0" turns the watch off (a backend whose trace cannot be taken)
COPIES = frozenset({"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize"})
# Ops that only move or make room for data: above a copy they say "an explicit transfer".
MOVEMENT = frozenset({
    "aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::empty_strided", "aten::empty",
    "aten::empty_like", "aten::contiguous", "aten::clone", "aten::resize_", "aten::set_", "aten::detach",
    "aten::lift_fresh", "aten::_has_compatible_shallow_copy_type", *COPIES,
})
# Ops whose result is a host value: a device-to-host read inside them is what they are for.
# Ops that read a value to the host by design, on every backend (linalg's error check reads the info tensor
# to raise): a copy inside them is a scalar read, not computing on the host.
SCALAR_READS = frozenset({"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal",
                          "aten::_linalg_check_errors"})


@dataclass(slots=True)
class HostCopies:
    """Filled in when the watched region ends: op -> the cross-device copies seen inside it."""

    by_op: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_op)

    def add(self, other: "HostCopies") -> None:
        for op, n in other.by_op.items():
            self.by_op[op] = self.by_op.get(op, 0) + n

    @property
    def ops(self) -> list[str]:
        return sorted(self.by_op)

    def describe(self) -> str:
        return ", ".join(f"{op} ({n} host<->device {'copy' if n == 1 else 'copies'} inside)"
                         for op, n in sorted(self.by_op.items()))


@dataclass(frozen=True, slots=True)
class HostExecution:
    """What ran on the host, from two independent sources: the backend's own tracking (``trace.fallback``,
    None where it cannot track) and host<->device copies seen inside an op (``copies``). Op and model cases
    report it the same way, so a cpu_fallback reads alike whichever kind of case found it."""

    trace: object  # conformance.target.OpTrace | None
    copies: HostCopies

    @property
    def ops(self) -> list[str]:
        return sorted({*(self.trace.fallback if self.trace is not None else ()), *self.copies.ops})

    def record(self, evidence: dict) -> None:
        """Adds the evidence: the ops tracked on the device and on the host, and the copies seen."""
        if self.trace is not None:
            evidence["fallback_ops"] = list(self.trace.fallback)
            evidence["executed_ops"] = list(self.trace.executed)
        if self.copies:
            evidence["host_copies"] = dict(self.copies.by_op)

    def fallback_message(self) -> str:
        """The message of a cpu_fallback outcome: right values, computed on the host."""
        seen = f" [seen in the profile: {self.copies.describe()}]" if self.copies else ""
        return f"numerically right, but ran on the host: {', '.join(self.ops[:4])}{seen}"

    def mismatch_note(self) -> str:
        """Appended to a mismatch's message: the host ops that may have computed the wrong values."""
        return f" [host fallback: {', '.join(self.ops[:3])}]" if self.ops else ""


def _devices(node: dict) -> set[str]:
    """Device types of a node's tensor arguments: the recorder's ``devices``, or an execution trace's argument
    values (a tensor is [id, storage, offset, numel, size, device])."""
    if "devices" in node:
        return set(node["devices"])
    found = set()
    for value in node.get("inputs", {}).get("values", []):
        if isinstance(value, list) and len(value) == 6 and isinstance(value[5], str):
            found.add(value[5].split(":")[0])
    return found


def _dispatch_key(device_type: str) -> str:
    import torch

    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    return {"cuda": "CUDA", "xla": "XLA", "mps": "MPS", "xpu": "XPU", "hpu": "HPU"}.get(device_type, "PrivateUse1")


@lru_cache(maxsize=None)
def _decomposed_by_pytorch(op: str, key: str) -> bool:
    """Whether ``op`` (``aten::name``) runs on this backend as PyTorch's own composite code.

    Such an op's code is the same on every backend without a kernel of its own: a copy it makes (ctc_loss
    reads its lengths on the host; ``_grouped_mm``'s composite, which the CPU runs too, reads its group
    offsets) is PyTorch's doing, not the backend computing on the host. An op with a kernel of the
    backend's own (registered for its dispatch key) is the backend's, whatever its code does.
    """
    import torch

    name = op.split("::", 1)[-1]
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return False
    qualified = [f"aten::{name}" + ("" if o == "default" else f".{o}") for o in packet.overloads()]

    def has(q: str, dispatch_key: str) -> bool:
        try:
            return torch._C._dispatch_has_kernel_for_dispatch_key(q, dispatch_key)
        except RuntimeError:  # an overload TorchScript knows and the dispatcher does not (aten::sin.int)
            return False

    composite = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")
    return (any(has(q, k) for q in qualified for k in composite)
            and not any(has(q, key) for q in qualified))


def host_executed_ops(nodes: list[dict], *, allowed: int = 0) -> dict[str, int]:
    """From execution-trace nodes: op -> host<->device copies seen inside its calls.

    A copy belongs to the innermost non-movement op above it; a copy inside another copy is the same copy.
    ``allowed``: copies one call may make without counting, for a call given that many CPU tensors on
    purpose (a backend may move them in).
    """
    by_id = {node["id"]: node for node in nodes}
    per_call: dict[int, tuple[str, int]] = {}
    for node in nodes:
        if node.get("name") not in COPIES:
            continue
        devices = _devices(node)
        if "cpu" not in devices or len(devices) < 2:
            continue
        key = _dispatch_key(next(d for d in devices if d != "cpu"))
        owner, inner_copy = None, False
        parent = by_id.get(node.get("ctrl_deps"))
        seen = {node["id"]}
        while parent is not None and parent["id"] not in seen:  # the trace's root is its own parent
            seen.add(parent["id"])
            name = parent.get("name", "")
            if name in SCALAR_READS:
                owner = None
                break
            if name in COPIES and len(_devices(parent)) > 1:
                inner_copy = True
                break
            if (owner is None and name.startswith("aten::") and name not in MOVEMENT
                    and not _decomposed_by_pytorch(name, key)):
                owner = parent
            parent = by_id.get(parent.get("ctrl_deps"))
        if owner is not None and not inner_copy:
            name, n = per_call.get(owner["id"], (owner["name"], 0))
            per_call[owner["id"]] = (name, n + 1)
    found: dict[str, int] = {}
    for name, n in per_call.values():
        if n > allowed:
            found[name] = found.get(name, 0) + n
    return found


# The head of a node as the execution trace writes it ("id": N, "name": "...", "ctrl_deps": M) and, after a
# copy's head, the start of its arguments' values.
_NODE_HEAD = re.compile(r'"id": (\d+), "name": "([^"\\]*(?:\\.[^"\\]*)*)", "ctrl_deps": (\d+)')
_VALUES = re.compile(r',\s*"inputs":\s*\{\s*"values":\s*')


def trace_nodes(text: str) -> list[dict]:
    """The nodes of an execution trace, as much of each as :func:`host_executed_ops` reads.

    A model's trace holds thousands of nodes with every argument (megabytes); decoding all of it took most
    of a model case's target side. Only a copy needs its arguments (their devices), so every node is read
    from its head (id, name, parent) and a copy's argument values are decoded besides. A trace laid out
    otherwise (a head or a copy this does not recognise) is decoded whole, as before.
    """
    heads = list(_NODE_HEAD.finditer(text))
    if len(heads) != text.count('"ctrl_deps"'):
        return json.loads(text).get("nodes", [])
    decoder = json.JSONDecoder()
    nodes = []
    for m in heads:
        name = json.loads(f'"{m.group(2)}"') if "\\" in m.group(2) else m.group(2)
        node = {"id": int(m.group(1)), "name": name, "ctrl_deps": int(m.group(3))}
        if name in COPIES:
            values = _VALUES.match(text, m.end())
            if values is None:
                return json.loads(text).get("nodes", [])
            node["inputs"] = {"values": decoder.raw_decode(text, values.end())[0]}
        nodes.append(node)
    return nodes


@contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """The profiler's native code logs every start and stop to stderr, whatever its log level says; those
    lines would flood a user's terminal, one pair per case. File descriptor 2 is muted for those calls only."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _recorder():
    """The C++ recorder (``conformance/csrc/copy_recorder.cpp``), or None where the package was installed
    without building it: the watch then records PyTorch's execution trace, the same nodes, slower."""
    try:
        from conformance import _copy_recorder
    except ImportError:
        return None
    return _copy_recorder


def recorder_nodes(records: list[tuple[int, str, int, list[str]]]) -> list[dict]:
    """The recorder's (id, name, parent, devices) as the nodes :func:`host_executed_ops` reads."""
    return [{"id": i, "name": name, "ctrl_deps": parent, "devices": devices} for i, name, parent, devices in records]


@contextmanager
def _recorded(recorder) -> Iterator[list[dict]]:
    recorder.start()
    nodes: list[dict] = []
    try:
        yield nodes
    finally:
        nodes.extend(recorder_nodes(recorder.stop()))


@contextmanager
def _execution_trace() -> Iterator[list[dict]]:
    """Records PyTorch's execution trace to a temporary file, read and removed at the end. Off where a profiler
    is already running in this process (the region then runs unwatched rather than failing)."""
    import torch
    from torch.profiler import ExecutionTraceObserver

    nodes: list[dict] = []
    if torch.autograd._profiler_enabled():
        yield nodes
        return
    fd, path = tempfile.mkstemp(prefix="neuron-validate-trace-", suffix=".json")
    os.close(fd)
    observer = ExecutionTraceObserver().register_callback(path)
    try:
        with _quiet_native_stderr():
            observer.start()
        try:
            yield nodes
        finally:
            with _quiet_native_stderr():
                observer.stop()
                observer.unregister_callback()
        with open(path) as f:
            nodes.extend(trace_nodes(f.read()))
    finally:
        os.unlink(path)


def recording(*, execution_trace: bool = False):
    """A context that yields a list, filled with the region's copy nodes when it ends: from the C++ recorder,
    or from PyTorch's execution trace when asked (or when the recorder was not built)."""
    recorder = None if execution_trace else _recorder()
    return _execution_trace() if recorder is None else _recorded(recorder)


@contextmanager
def watch_host_copies(enabled: bool = True, *, allowed: int = 0) -> Iterator[HostCopies]:
    """Watches the region for host<->device copies inside ops and fills the yielded HostCopies when it ends."""
    copies = HostCopies()
    if not enabled or os.environ.get(WATCH_ENV, "1") == "0":
        yield copies
        return
    with recording() as nodes:
        yield copies
    copies.by_op = host_executed_ops(nodes, allowed=allowed)
