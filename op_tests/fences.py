"""Poison fences for the CPU's second run of a sample: a kernel that reads past its input's storage, or leaves
part of its output unwritten, shows up as a reference that does not reproduce itself, not as a target
mismatch (the judge's determinism rerun, diff/judge.py)."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves


FENCE = 256  # elements of poison after each input's storage in the second reference run


def fenced(parts):
    """The inputs again, each storage followed by poison.

    A kernel that reads past its input's storage (seen with stride-0,
    expanded inputs) reads whatever lies there; in two reference runs in a row
    that is usually the same, so the reference looks deterministic while the
    target, with other neighbours, differs. With poison after the storage,
    such a kernel shows up as a reference that does not reproduce itself.
    """
    from torch.utils._pytree import tree_map

    def fence(t):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.is_conj() or t.is_neg() or not t.numel():
            return t
        n = t.untyped_storage().nbytes() // t.element_size()
        poison = True if t.dtype == torch.bool else 77 if not (t.is_floating_point() or t.is_complex()) else 1.2345e4
        buf = torch.full((n + FENCE,), poison, dtype=t.dtype)
        buf[:n].copy_(torch.as_strided(t.detach(), (n,), (1,), 0))
        out = buf.as_strided(t.size(), t.stride(), t.storage_offset())
        return out.requires_grad_(t.requires_grad) if t.requires_grad else out

    return tree_map(fence, parts)


def poison_free_memory(like) -> None:
    """Fills, then frees, blocks the size of the reference's outputs before the second reference run.

    A kernel that leaves part of its output unwritten returns whatever the
    allocator hands back; two runs in a row usually get the same block with
    the same leftovers and would agree. With the blocks poisoned, such a
    kernel shows up as non-deterministic instead of as a target mismatch.
    """
    blocks = [torch.full(t.shape, 1.2345e4, dtype=t.dtype) if t.is_floating_point() else torch.full(t.shape, 77, dtype=t.dtype)
              for t in tree_leaves(like) if isinstance(t, torch.Tensor) and t.layout == torch.strided
              and not t.is_complex() and t.dtype != torch.bool]
    del blocks
