"""The op's own samples that a strategy transforms, and how a transformed sample is put together.

A template is a plain OpInfo sample: dense strided tensors (no conjugate or
negative views), the default output processing, inputs with no empty
dimension. Strategies never invent an op's arguments; they change the tensors
of samples the op's authors wrote, so every op with samples can take part.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

_DEFAULT_OUTPUT_PROCESS = "SampleInput.__init__.<locals>.<lambda>"
SCANNED = 48  # OpInfo samples looked at per case, at most


def is_plain(sample, *, processed_outputs: bool = True) -> bool:
    """Dense strided tensors, no conjugate or negative views; ``processed_outputs``: the sample may post-process
    the op's outputs (svd's signs, say), which derived samples keep (``make_sample(like=...)``)."""
    if not processed_outputs and getattr(sample.output_process_fn_grad, "__qualname__", "") != _DEFAULT_OUTPUT_PROCESS:
        return False
    leaves = tensor_leaves(parts_of(sample))
    return bool(leaves) and all(
        type(t) is torch.Tensor and t.layout == torch.strided and not t.is_conj() and not t.is_neg()
        for t in leaves)


def parts_of(sample) -> tuple:
    return sample.input, tuple(sample.args), dict(sample.kwargs)


def tensor_leaves(parts) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(parts)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def templates(op, case, *, requires_grad: bool, limit: int, smallest_first: bool = False, keep=None,
              scanned: int = SCANNED, processed_outputs: bool = True) -> list:
    """Up to ``limit`` plain samples of the op for the case's dtype (OpInfo's order, or smallest first) for
    which ``keep(sample)`` holds, among the first ``scanned`` of its sample inputs."""
    torch.manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    found = []
    for i, sample in enumerate(op.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
        if i >= scanned:
            break
        if is_plain(sample, processed_outputs=processed_outputs) and (keep is None or keep(sample)):
            found.append(sample)
    if smallest_first:
        found.sort(key=lambda s: sum(t.numel() for t in tensor_leaves(parts_of(s))))
    return found[:limit]


def primary(parts) -> torch.Tensor | None:
    """The tensor a strategy resizes or relayouts first: the sample's input, or the first tensor of an input list."""
    inp = parts[0]
    if isinstance(inp, torch.Tensor):
        return inp
    if isinstance(inp, (list, tuple)):
        return next((t for t in inp if isinstance(t, torch.Tensor)), None)
    return None


def map_tensors(parts, fn: Callable[[int, torch.Tensor], object]) -> tuple:
    """``parts`` with each tensor leaf replaced by ``fn(index, tensor)`` (index in flattening order)."""
    leaves, spec = tree_flatten(parts)
    out, k = [], 0
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(fn(k, leaf))
            k += 1
        else:
            out.append(leaf)
    return tree_unflatten(out, spec)


def replace_values(parts, dtype: torch.dtype, fn: Callable[[int, torch.Tensor], torch.Tensor]) -> tuple | None:
    """``parts`` with each non-empty tensor of ``dtype`` replaced by ``fn(index, tensor)``, requiring grad as it
    did; None when there is no such tensor (the other tensors, indices and masks, are left alone)."""
    changed = False

    def replace(index, t):
        nonlocal changed
        if t.dtype != dtype or t.numel() == 0:
            return t
        changed = True
        return keep_grad(fn(index, t), t)

    moved = map_tensors(parts, replace)
    return moved if changed else None


def keep_grad(new: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``new`` detached, requiring grad exactly when ``like`` did (a leaf either way)."""
    new = new.detach()
    if like.requires_grad and (new.is_floating_point() or new.is_complex()):
        new.requires_grad_(True)
    return new


def make_sample(parts, name: str, variant: str = "", *, like=None):
    """An OpInfo SampleInput named after what makes it special; ``variant`` says how the op is called;
    ``like``: the sample it derives from, whose processing of the op's outputs it keeps."""
    inp, args, kwargs = parts
    extra = {"output_process_fn_grad": like.output_process_fn_grad} if like is not None else {}
    return _sample_type()(inp, args=tuple(args), kwargs=dict(kwargs), name=name, variant=variant, **extra)


_SAMPLE_TYPE = None


def _sample_type():
    """OpInfo's SampleInput with one more slot: the variant (strategies/variants.py) the sample is run as."""
    global _SAMPLE_TYPE
    if _SAMPLE_TYPE is None:
        from torch.testing._internal.opinfo.core import SampleInput

        class StrategySample(SampleInput):
            __slots__ = ("variant",)

            def __init__(self, *args, variant: str = "", **kwargs):
                super().__init__(*args, **kwargs)
                self.variant = variant

        _SAMPLE_TYPE = StrategySample
    return _SAMPLE_TYPE


def numel(parts) -> int:
    return sum(t.numel() for t in tensor_leaves(parts))


def has_empty(parts) -> bool:
    return any(0 in t.shape for t in tensor_leaves(parts))


def runs_on_cpu(op, parts, fn=None) -> bool:
    """Whether the op accepts these inputs on the CPU (the reference): a strategy keeps only what the op allows."""
    inp, args, kwargs = parts
    try:
        with torch.no_grad():
            (fn or op)(inp, *args, **kwargs)
        return True
    except Exception:  # noqa: BLE001 - any refusal means the op does not allow this transformation
        return False
