"""The ``sizes`` input strategy: lengths across hardware tile boundaries, and long reductions.

Trainium's partition dimension is 128, and accelerator kernels tile at 128,
256, 512 and 2048; a kernel that normalises each tile on its own, or drops
the last partial tile, is right for every length OpInfo uses (5, 10, 20).
So a template is resized on one dimension at a time (its leading one, its
last one and the one its ``dim`` argument names) to 1, 127, 128, 129, 255,
256, 257, 511, 512, 513, 2047, 2048 and 2049, and the last and ``dim``
dimensions also to 65,536 and 65,537: long reductions, where an
accumulator's precision or a partial sum's tiling shows.

Resizing gathers the template's own values along that dimension (the first
ones when shrinking, seeded random picks when growing), so an op's domain
(acos in [-1, 1], indices in range) is kept. Other tensors follow where
the op couples them: the dimension aligned with it by broadcasting, or
failing that every dimension of the same length (the contracted dimension
of a matmul). A first try at length+1 on the CPU tells which coupling the op
allows; a template none fits is left out.
"""

from __future__ import annotations

import math

import torch

from .templates import (has_empty, keep_grad, make_sample, map_tensors, numel, parts_of, primary, runs_on_cpu,
                        templates, tensor_leaves)

TILE_SIZES = (1, 127, 128, 129, 255, 256, 257, 511, 512, 513, 2047, 2048, 2049)
LEADING_SIZES = (1, 127, 128, 129, 256, 257, 2049)  # the leading dimension: the partition boundary and a long one
LONG_SIZES = (65536, 65537)
MAX_NUMEL = 2**19  # elements of one sample (all its tensors), inputs and outputs each
MAX_NUMEL_LONG = 2**20
MAX_OUTPUTS = 64  # tensors an op returns (unbind of 65,536 rows returns 65,536)
MAX_FLOPS = 2**28  # per sample, counted on the meta device (matmuls and convolutions): a fraction of a second
UNMEASURED_MAX = 513  # the longest length tried where the op's output size cannot be known beforehand
TEMPLATES_SCANNED = 4
COUPLINGS = ("aligned", "same length", "same length and size arguments", "alone")


def _dim_argument(template, rank: int) -> int | None:
    dim = template.kwargs.get("dim")
    if dim is None and template.args and isinstance(template.args[0], int) and not isinstance(template.args[0], bool):
        dim = template.args[0]
    if isinstance(dim, int) and not isinstance(dim, bool) and -rank <= dim < rank:
        return dim % rank
    return None


def _index(old: int, new: int, gen: torch.Generator) -> torch.Tensor:
    if new <= old:
        return torch.arange(new)
    return torch.cat([torch.arange(old), torch.randint(0, old, (new - old,), generator=gen)])


def _untied(t: torch.Tensor, dim: int, old: int) -> torch.Tensor:
    """The picked copies (past ``old`` on ``dim``) scaled towards 0 by distinct factors (steps of 2^-21, four
    float32 ulps; 3% at most), so they tie neither with the values they copy nor with each other: ops whose
    result depends on how ties break (quantile's gradient, sort's indices) stay comparable. Scaling towards
    0 keeps a symmetric domain (acos's [-1, 1]) and the sign."""
    n = t.shape[dim]
    shape = [1] * t.dim()
    shape[dim] = n
    steps = torch.arange(n, dtype=torch.float64).clamp(min=old - 1) - (old - 1)
    factor = (1 - steps * 2.0**-21).reshape(shape)
    return (t.double() * factor).to(t.dtype)


def resized(parts, dim: int, new: int, coupling: str, seed: int, leaf: int | None = None, *,
            limit: int | None = None):
    """``parts`` with the primary tensor's (or tensor leaf ``leaf``'s) ``dim`` of length ``new``, and the coupled
    dimensions of the others; None when that would make more than ``limit`` elements (checked before any is
    made: coupling every dimension of matmul's 5 x 5 operands to 65,536 would be 8 GB)."""
    x = primary(parts) if leaf is None else tensor_leaves(parts)[leaf]
    old = x.shape[dim]

    def coupled(t: torch.Tensor) -> list[int]:
        if t is x:
            return [dim]
        if coupling == "aligned":
            j = t.dim() - (x.dim() - dim)
            return [j] if 0 <= j < t.dim() and t.shape[j] == old else []
        if coupling.startswith("same length"):
            return [j for j in range(t.dim()) if t.shape[j] == old]
        if coupling.startswith("dim "):  # "dim J of operand K": that one dimension of that one leaf
            j, k = (int(w) for w in coupling.split()[1::3])
            return [j] if tensor_leaves(parts)[k] is t else []
        return []

    if limit is not None:
        sizes = [[new if j in coupled(t) else n for j, n in enumerate(t.shape)] for t in tensor_leaves(parts)]
        if sum(math.prod(shape) for shape in sizes) > limit:
            return None
    gen = torch.Generator().manual_seed(seed * 7919 + dim * 131 + new)
    index = _index(old, new, gen)

    def resize(_, t: torch.Tensor):
        dims = coupled(t)
        if not dims:
            return t
        out = t.detach()
        for j in dims:
            out = out.index_select(j, index)
            if new > old and out.is_floating_point():
                out = _untied(out, j, old)
        return keep_grad(out.contiguous(), t)

    out = map_tensors(parts, resize)
    if coupling == "same length and size arguments":  # layer_norm's normalized_shape, view's sizes, ...
        out = (out[0], tuple(_sizes_replaced(a, old, new) for a in out[1]),
               {k: _sizes_replaced(v, old, new) for k, v in out[2].items()})
    return out


def _sizes_replaced(value, old: int, new: int):
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                          for v in value):
        return type(value)(new if v == old else v for v in value)
    return value


def coupling_of(op, parts, dim: int, seed: int, leaf: int | None = None) -> str | None:
    x = primary(parts) if leaf is None else tensor_leaves(parts)[leaf]
    for coupling in COUPLINGS:
        if runs_on_cpu(op, resized(parts, dim, x.shape[dim] + 1, coupling, seed, leaf)):
            return coupling
    # One dimension of one other operand, where the others of that length must keep theirs (bmm's K: the
    # batch of 10 and K of 10 in [10, 5, 10] @ [10, 10, 5]).
    for k, t in enumerate(tensor_leaves(parts)):
        for j in range(t.dim()):
            coupling = f"dim {j} of operand {k}"
            if t is not x and t.shape[j] == x.shape[dim] and runs_on_cpu(
                    op, resized(parts, dim, x.shape[dim] + 1, coupling, seed, leaf)):
                return coupling
    return None


def _output_size(op, parts) -> tuple[int, int, int] | None:
    """(tensors, elements, flops) of the op on these inputs, from a run on the meta device (no data, no
    time); None where the op cannot run there."""
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    meta = map_tensors(parts, lambda _, t: t.detach().to("meta"))
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as flops:
            out = op(meta[0], *meta[1], **meta[2])
    except Exception:  # noqa: BLE001 - data-dependent shapes, ops without meta kernels
        return None
    tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    return len(tensors), sum(t.numel() for t in tensors), flops.get_total_flops()


def affordable(op, candidate, new: int) -> bool:
    """Inputs and outputs within the element budget, and not thousands of outputs: a sample the sweep can
    afford on both sides, forward and backward."""
    limit = MAX_NUMEL_LONG if new in LONG_SIZES else MAX_NUMEL
    if numel(candidate) > limit:
        return False
    size = _output_size(op, candidate)
    if size is None:
        return new <= UNMEASURED_MAX
    tensors, elements, flops = size
    return tensors <= MAX_OUTPUTS and elements <= limit and flops <= MAX_FLOPS


def make_samples(op, case) -> list:
    backward = case.mode == "backward"
    def resizable(sample) -> bool:
        x = primary(parts_of(sample))
        return x is not None and x.dim() > 0 and not has_empty(parts_of(sample))

    found = templates(op, case, requires_grad=backward, limit=TEMPLATES_SCANNED * 3, keep=resizable)
    # Rank 2 and up first (a leading and a last dimension), smallest first.
    found.sort(key=lambda s: (primary(parts_of(s)).dim() < 2, numel(parts_of(s))))
    for k, template in enumerate(found[:TEMPLATES_SCANNED]):
        parts = parts_of(template)
        x = primary(parts)
        rank = x.dim()
        dims = list(dict.fromkeys(d for d in (rank - 1, 0, _dim_argument(template, rank)) if d is not None))
        samples = []
        for dim in dims:
            coupling = coupling_of(op, parts, dim, case.seed)
            if coupling is None:
                continue
            long_ok = dim != 0 or rank == 1 or dim == _dim_argument(template, rank)
            sizes = TILE_SIZES if dim != 0 or rank == 1 or dim == _dim_argument(template, rank) else LEADING_SIZES
            for new in sizes + (LONG_SIZES if long_ok else ()):
                candidate = resized(parts, dim, new, coupling, case.seed,
                                    limit=MAX_NUMEL_LONG if new in LONG_SIZES else MAX_NUMEL)
                if candidate is None or not affordable(op, candidate, new):
                    continue
                label = f"dim {dim - rank}" if dim == rank - 1 else f"dim {dim}"
                samples.append(make_sample(candidate, f"length {new} on {label} (sample {k}, {coupling})",
                                               like=template))
        if samples:
            return samples
    return []
