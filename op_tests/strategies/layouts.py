"""The ``layouts`` input strategy: the same sample with non-contiguous tensors.

A kernel that ignores strides, the storage offset, or a stride of 0 reads
the wrong elements; OpInfo's samples are mostly contiguous, so it would go
unseen. Each template runs as it is (the control) and then with every tensor
argument stored another way:

- transposed: the last two dimensions swapped in memory (same values);
- sliced with a step: every other element of a buffer twice as wide, the
  gaps poisoned so that a kernel that reads them shows it (same values);
- expanded: the first slice along dim 0 broadcast over it (stride 0);
- channels-last: NHWC (rank 4) or NDHWC (rank 5) memory order (same values);
- storage offset: the tensor starts 7 elements into a poisoned buffer.

:func:`relayout` rebuilds a (smaller) tensor in the layout of another: the
shrinker uses it so that a reproducer keeps the layout that fails.
"""

from __future__ import annotations

import torch

from .templates import SCANNED, has_empty, keep_grad, make_sample, map_tensors, numel, parts_of, primary, templates

OFFSET = 7
TEMPLATES = 3
MAX_NUMEL = 2**16  # elements of a template's tensors


def _poison(dtype: torch.dtype):
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return 77


def transposed(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 2 or t.shape[-1] == 1 and t.shape[-2] == 1:
        return None
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def step_sliced(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 1 or t.numel() < 2:
        return None
    buf = torch.full((*t.shape[:-1], 2 * t.shape[-1]), _poison(t.dtype), dtype=t.dtype)
    view = buf[..., ::2]
    view.copy_(t)
    return view


def expanded(t: torch.Tensor) -> torch.Tensor | None:
    if t.dim() < 1 or t.shape[0] < 2:
        return None
    return t.detach().narrow(0, 0, 1).clone().expand(t.shape)


def channels_last(t: torch.Tensor) -> torch.Tensor | None:
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    if fmt is None:
        return None
    out = t.contiguous(memory_format=fmt)
    return None if out.stride() == t.stride() else out


def offset(t: torch.Tensor) -> torch.Tensor | None:
    if t.numel() == 0:
        return None
    buf = torch.full((t.numel() + OFFSET,), _poison(t.dtype), dtype=t.dtype)
    view = buf[OFFSET:].view(t.shape)
    view.copy_(t)
    return view


LAYOUTS = {
    "transposed": ("transposed input", transposed),
    "step": ("input sliced with a step", step_sliced),
    "expanded": ("expanded input (stride 0)", expanded),
    "channels_last": ("channels-last input", channels_last),
    "offset": ("input at a storage offset", offset),
}


def make_samples(op, case) -> list:
    backward = case.mode == "backward"
    out = []
    found = templates(op, case, requires_grad=backward, limit=SCANNED,
                      keep=lambda s: not has_empty(parts_of(s)) and numel(parts_of(s)) <= MAX_NUMEL)
    found = [_as_matrix(op, s) for s in found]
    # Templates of rank 2 and 3 first (they can be transposed), rank 4 and 5 next (channels-last), small first.
    found.sort(key=lambda s: (_rank_preference(primary(parts_of(s))), numel(parts_of(s))))
    for k, template in enumerate(found[:TEMPLATES]):
        parts = parts_of(template)
        out.append(make_sample(parts, f"contiguous input (sample {k})", like=template))
        for description, transform in LAYOUTS.values():
            changed = False

            def apply(_, t, transform=transform):
                nonlocal changed
                new = transform(t.detach())
                if new is None:
                    return t
                changed = True
                return keep_grad(new, t)

            moved = map_tensors(parts, apply)
            if changed:
                out.append(make_sample(moved, f"{description} (sample {k})", like=template))
    return out


def _as_matrix(op, template):
    """For an element-wise op whose sample is a vector: the same values as a matrix (every tensor of the
    vector's shape reshaped alike), so that it can be transposed. Other samples come back as they are."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, UnaryUfuncInfo

    parts = parts_of(template)
    x = primary(parts)
    if not isinstance(op, (UnaryUfuncInfo, BinaryUfuncInfo)) or x is None or x.dim() != 1:
        return template
    n = x.shape[0]
    rows = max((d for d in range(2, int(n**0.5) + 1) if n % d == 0), default=0)
    if not rows:
        return template
    shape = x.shape

    def reshape(_, t):
        return keep_grad(t.detach().reshape(rows, n // rows), t) if t.shape == shape else t

    return make_sample(map_tensors(parts, reshape), template.name or "", like=template)


def _rank_preference(x) -> int:
    rank = x.dim() if x is not None else 0
    return 0 if rank in (2, 3) else 1 if rank in (4, 5) else 2


# ---------------------------------------------------------------- keeping a layout while shrinking
def relayout(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` (any layout) stored the way ``like`` is: its dimension order in memory, its stride-0
    (expanded) dimensions, a gap between elements when ``like`` has one, and a storage offset when it has one.

    ``values`` must have ``like``'s rank. Expanded dimensions take ``values``' first slice.
    """
    if values.dim() != like.dim() or values.numel() == 0 or like.dim() == 0:
        return _offset_like(values.contiguous(), like)
    expanded_dims = [d for d in range(like.dim()) if like.stride(d) == 0 and like.shape[d] > 1]
    base = values
    for d in expanded_dims:
        base = base.narrow(d, 0, 1)
    # dimension order in memory: largest stride first (ties keep the logical order)
    order = sorted(range(like.dim()), key=lambda d: (-like.stride(d), d))
    dense = base.permute(order).contiguous()
    inner_stride = min((like.stride(d) for d in range(like.dim()) if like.shape[d] > 1 and like.stride(d) > 0),
                       default=1)
    if inner_stride > 1 and dense.dim():
        buf = torch.full((*dense.shape[:-1], 2 * dense.shape[-1]), _poison(dense.dtype), dtype=dense.dtype)
        gapped = buf[..., ::2]
        gapped.copy_(dense)
        dense = gapped
    if like.storage_offset() > 0:
        dense = offset(dense) if dense.is_contiguous() else dense
    inverse = [order.index(d) for d in range(like.dim())]
    out = dense.permute(inverse)
    return out.expand(values.shape) if expanded_dims else out


def _offset_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return offset(t) if like.storage_offset() > 0 and t.numel() else t
