"""Forward hooks on every module: outputs in completion order, the gradients flowing into them, the module stack."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from ..sides import to_device
from .results import ROOT
from .tracer import OpTracer, cpu_copy, tensors

DEFAULT_RECORD_BYTES = 512 * 2**20


@dataclass(slots=True)
class Call:
    name: str
    type: str
    call: int
    outputs: list[torch.Tensor | None]
    grads: list[torch.Tensor | None]
    parent: tuple[str, int] | None = None  # the enclosing module call


class Recorder:
    """Forward hooks on every module: outputs in completion order, gradients into them, the module stack."""

    def __init__(self, model: torch.nn.Module, *, tracer: OpTracer | None = None,
                 max_bytes: int = DEFAULT_RECORD_BYTES, capture: tuple[str, int] | None = None,
                 prefix: str = "") -> None:
        self.calls: list[Call] = []
        self.stack: list[tuple[str, int]] = []  # (module, its call index) of the calls in progress
        self.counts: dict[str, int] = {}
        self.tracer = tracer
        self.handles = []
        self.budget = max_bytes
        self.truncated = False
        self.capture = capture
        self.captured: tuple[tuple, dict] | None = None
        for name, module in model.named_modules():
            label = ".".join(p for p in (prefix, name) if p) or ROOT
            self.handles.append(module.register_forward_pre_hook(self._pre(label), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post(label)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def current(self) -> str | None:
        return self.stack[-1][0] if self.stack else None

    def _paused(self):
        return self.tracer.pause() if self.tracer is not None else nullcontext()

    def _pre(self, name: str):
        def hook(module, args, kwargs):
            self.stack.append((name, self.counts.get(name, 0)))
            if self.capture is not None and self.capture[0] == name and self.counts.get(name, 0) == self.capture[1]:
                with self._paused():
                    self.captured = (to_device(args, "cpu", requires_grad=False), to_device(kwargs, "cpu", requires_grad=False))
                raise Captured()
            return None

        return hook

    def _post(self, name: str):
        def hook(module, args, output):
            parent = None
            if self.stack and self.stack[-1][0] == name:
                self.stack.pop()
                parent = self.stack[-1] if self.stack else None
            call = self.counts.get(name, 0)
            self.counts[name] = call + 1
            leaves = tensors(output)
            with self._paused():
                outputs: list[torch.Tensor | None] = []
                for t in leaves:
                    size = t.numel() * t.element_size()
                    if self.budget - size < 0:
                        self.truncated = True
                        outputs.append(None)
                    else:
                        self.budget -= size
                        outputs.append(cpu_copy(t))
            record = Call(name=name, type=type(module).__name__, call=call, outputs=outputs, grads=[None] * len(leaves),
                           parent=parent)
            index = len(self.calls)
            self.calls.append(record)
            for j, t in enumerate(leaves):
                if t.requires_grad and (t.is_floating_point() or t.is_complex()):
                    t.register_hook(self._grad_hook(index, j))
            return None

        return hook

    def _grad_hook(self, index: int, j: int):
        def hook(grad):
            with self._paused():
                self.calls[index].grads[j] = cpu_copy(grad)
            return None

        return hook


class Captured(Exception):
    """Stops a forward once the inputs of the drilled-into module are captured."""

