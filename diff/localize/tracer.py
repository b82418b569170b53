"""Recording every ATen op a side dispatches: its name, devices, source line and (optionally) outputs."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from ..sides import to_device
from .results import TraceEvent
from .source import SourceLine, current_source


def cpu_copy(t: torch.Tensor | None) -> torch.Tensor | None:
    """A detached dense copy on the CPU: what a recording keeps of a tensor."""
    if t is None:
        return None
    if t.layout != torch.strided:
        t = t.detach().to_dense()
    return to_device(t, "cpu", requires_grad=False)


@dataclass(slots=True)
class _OpEvent:
    op: str
    source: SourceLine | None
    module: str | None
    outputs: list[torch.Tensor | None]


def tensors(value) -> list[torch.Tensor]:
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


# Arguments PyTorch takes on the CPU whatever the device: a packed sequence's lengths and batch sizes
# (``pack_padded_sequence``: "lengths ... must be on the CPU"), which CUDA's kernels read on the host too,
# and advanced indexing's indices, which ATen's own index kernels move to the indexed tensor's device
# (``x[torch.tensor([0, 2])]`` on CUDA). Given on the CPU beside device tensors they are not a placement
# error (an LSTM over packed sequences was NOT READY: "_pack_padded_sequence mixes a CPU tensor with neuron
# tensors").
HOST_ARGUMENTS = {"aten::_pack_padded_sequence": "lengths", "aten::_pad_packed_sequence": "batch_sizes",
                  "aten::_pack_padded_sequence_backward": "batch_sizes", "aten::lstm": "batch_sizes",
                  "aten::gru": "batch_sizes", "aten::rnn_tanh": "batch_sizes", "aten::rnn_relu": "batch_sizes",
                  "aten::index": "indices", "aten::index_put_": "indices", "aten::index_put": "indices",
                  "aten::_index_put_impl_": "indices"}


def _cpu_inputs(func, args, kwargs, inputs: list[torch.Tensor]) -> int:
    """CPU tensors of one or more dimensions among an op's ``inputs`` (0-dim ones are scalars), the arguments
    PyTorch keeps on the host (:data:`HOST_ARGUMENTS`) left out (only those ops' arguments are looked at again)."""
    host = HOST_ARGUMENTS.get(func._schema.name)
    if host is not None:
        names = [a.name for a in func._schema.arguments]
        args = [a for name, a in zip(names, args) if name != host] + list(args[len(names):])
        inputs = tensors((args, {k: v for k, v in kwargs.items() if k != host}))
    return sum(1 for t in inputs if t.device.type == "cpu" and t.dim() > 0)


class OpTracer(TorchDispatchMode):
    """Records every ATen op dispatched while active: its name, devices, source line and (optionally) outputs."""

    def __init__(self, *, keep_outputs: bool = False, source_files: Iterable[str] = (),
                 module_of: Callable[[], str | None] | None = None) -> None:
        super().__init__()
        self.keep_outputs = keep_outputs
        self.source_files = frozenset(os.path.abspath(f) for f in source_files)
        self.module_of = module_of
        self.events: list[TraceEvent] = []
        self.values: list[_OpEvent] = []
        self.paused = 0

    @contextmanager
    def pause(self):
        """Ops the harness itself runs (copies in hooks) are not the model's."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception:
            self._record(func, args, kwargs, None, failed=True)
            raise
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out, *, failed: bool = False) -> None:
        name = func._schema.name
        source = current_source(self.source_files)
        inputs = tensors((args, kwargs))
        outputs = tensors(out) if out is not None else []
        devices_in = tuple(sorted({t.device.type for t in inputs}))
        self.events.append(TraceEvent(
            op=name, source=source, module=self.module_of() if self.module_of else None,
            input_devices=devices_in, output_devices=tuple(sorted({t.device.type for t in outputs})),
            cpu_inputs=_cpu_inputs(func, args, kwargs, inputs),
            factory=not inputs, failed=failed,
        ))
        if self.keep_outputs and not failed:
            self.values.append(_OpEvent(op=name, source=source, module=self.events[-1].module,
                                        outputs=[cpu_copy(t) for t in outputs]))


