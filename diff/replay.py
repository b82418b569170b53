"""Op by op from the reference's inputs: a check that an ill-conditioned whole cannot hide a fault in.

A configuration whose reference spread under the device's precision leaves
no significant bit (the noise floor's ``inconclusive``) cannot be judged as a
whole: a table's rounding and a 5% fault in a convolution both end up as O(1)
differences after batch norm over two images. Each op alone is well
conditioned, though. :func:`replay_ops` runs the reference once more under a
dispatch mode that, for every ATen op with floating outputs, runs the same op
on the target from copies of the reference's own inputs to it, and asks the
one judge (diff.judge) about that op alone, with the op's own float64 golden
and noise floor. The first op the judge fails is evidence of a wrong target
that no conditioning explains; an upstream error cannot reach it, because
every op starts from the reference's values.

Left out: random ops (the target draws its own stream), ops that make
uninitialised memory, copies between devices, and integer or boolean
outputs (indices of tied values may differ correctly; the ops that use them
are replayed from the reference's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from .draws import draws
from .precision import PrecisionModel, perturbed_runs
from .sides import to_device

NOISE_RUNS = 4  # perturbed runs of one op (cheap: the op alone)
SKIPPED = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
           "aten::copy_", "aten::_to_copy", "aten::detach", "aten::lift_fresh", "aten::_local_scalar_dense",
           "aten::set_", "aten::resize_", "aten::clone")


@dataclass(slots=True, kw_only=True)
class OpReplay:
    """What replaying the reference's ops on the target found: the first op the judge failed, if any."""

    judged: int = 0  # ops judged
    first: str = ""  # "aten::convolution.default (op 12 of the run, backward)", or "" when none failed
    message: str = ""  # the judge's message about that op
    errors: list[str] = field(default_factory=list)  # ops the target could not run alone (not a verdict)

    def __bool__(self) -> bool:
        return not self.first

    def describe(self) -> str:
        if self.first:
            return f"op by op from the reference's inputs, {self.first} is off: {self.message}"
        return f"each of the {self.judged} ops judged agrees when it starts from the reference's inputs"

    def to_dict(self) -> dict:
        return {"judged": self.judged, "first": self.first, "message": self.message, "errors": self.errors[:5]}


class _Found(Exception):
    """Stops the reference run at the first failing op."""


def _floating(value) -> bool:
    return any(isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) for t in tree_leaves(value))


def replay_ops(run: Callable[[], Any], *, device: torch.device, judge_for: Callable[[str], Any],
               precision: PrecisionModel | None = None, max_ops: int = 5000) -> OpReplay:
    """Runs ``run()`` (a reference run on the CPU) and judges each of its ops on ``device``.

    ``judge_for(op_name)``: the diff.judge.Judge for that op's outputs (its tolerance; the target's precision
    model). Stops at the first op judged off, or after ``max_ops`` ops.
    """
    result = OpReplay()
    seen = [0]

    def judge_op(func, args, kwargs, out, phase: str) -> None:
        name = func._schema.name
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if (not tensors or name in SKIPPED or draws(func, args, kwargs)
                or not _floating(out) or any(t.device.type != "cpu" for t in tensors)):
            return
        result.judged += 1
        try:
            a, k = to_device((args, kwargs), device, requires_grad=False, redirect="cpu")
            actual = func(*a, **k)
        except Exception as exc:  # noqa: BLE001 - the op alone may not run where the whole did (not a verdict)
            result.errors.append(f"{name}: {type(exc).__name__}")
            return

        def again(dtype=None):
            a, k = to_device((args, kwargs), "cpu", dtype, requires_grad=False)
            return func(*a, **k)

        only_floating = _keep_floating(out)
        judgement = judge_for(name)(
            _keep_floating(actual, like=out), only_floating, path=name,
            golden=lambda: _keep_floating(again({torch.float32: torch.float64, torch.float16: torch.float64,
                                                  torch.bfloat16: torch.float64}), like=out),
            noise=lambda: [_keep_floating(r, like=out) for r in perturbed_runs(again, precision, runs=NOISE_RUNS)]
            if precision else [])
        if not judgement:
            result.first = f"{func} (op {seen[0]} of the run, {phase})"
            result.message = judgement.message
            raise _Found

    class _Replay(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            seen[0] += 1
            inputs = (args, kwargs)
            if func._schema.is_mutable:  # the reference's inputs before the op changes them
                inputs = to_device((args, kwargs), None, requires_grad=False)
            out = func(*args, **kwargs)
            if result.judged < max_ops:
                phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
                judge_op(func, inputs[0], inputs[1], out, phase)
            return out

    try:
        with _Replay():
            run()
    except _Found:
        pass
    return result


def _keep_floating(value, like=None):
    """The floating tensors of an op's output (integer outputs such as indices are left out: None)."""
    reference = value if like is None else like

    def keep(v, r):
        if isinstance(r, torch.Tensor) and (r.is_floating_point() or r.is_complex()):
            return v.detach() if isinstance(v, torch.Tensor) else v
        return None

    if like is None:
        return tree_map(lambda v: keep(v, v), value)
    flat_v, flat_r = tree_leaves(value), tree_leaves(reference)
    if len(flat_v) != len(flat_r):
        return tree_map(lambda v: keep(v, v), value)
    kept = iter([keep(v, r) for v, r in zip(flat_v, flat_r)])
    return tree_map(lambda _: next(kept), reference)


__all__ = ["OpReplay", "replay_ops"]
