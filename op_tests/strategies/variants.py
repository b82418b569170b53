"""The ``variants`` input strategy: in-place, ``out=`` and views, against the functional result.

A backend can compute ``add`` right and still get ``add_`` or
``add(out=...)`` wrong: a kernel that returns a new tensor instead of its
argument, ignores a preallocated output, does not resize an empty one, or
implements a view as a copy (so writing through it leaves the base alone).
Each variant runs on both sides and returns a dict the judge compares like
any output: the values, and the identity and aliasing facts as booleans.

- ``inplace``: ``op_(x, ...)``: the mutated ``x``, and whether ``x`` itself
  came back;
- ``out``: ``op(x, ..., out=o)`` with ``o`` preallocated at the right size;
  ``out_resize``: with ``o`` empty, which the op must resize;
- ``view``: for ops whose output aliases their input on the CPU: whether it
  shares the input's storage on the target too, and the input after
  writing through the output.

:func:`run_variant` is also embedded in reproducers, so it needs only torch.
"""

from __future__ import annotations

import torch

from .templates import make_sample, parts_of, templates

TEMPLATES = 3
DESCRIPTIONS = {
    "inplace": "in-place variant",
    "out": "out= with a preallocated tensor",
    "out_resize": "out= with an empty tensor to resize",
    "view": "view aliasing its input",
}


def applies(op) -> bool:
    return op.inplace_variant is not None or op.supports_out or _may_view(op)


def _may_view(op) -> bool:
    # Known for view semantics, or an alias/reshape/indexing op whose output may share storage.
    return op.name in VIEW_CANDIDATES or op.name.startswith(("view", "as_strided", "expand", "narrow", "unflatten"))


VIEW_CANDIDATES = {
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "squeeze", "unsqueeze", "transpose", "t",
    "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "adjoint", "mT", "mH", "T", "H", "narrow", "select",
    "split", "split_with_sizes", "tensor_split", "hsplit", "vsplit", "dsplit", "chunk", "unbind", "unfold",
    "diagonal", "expand", "expand_as", "as_strided", "real", "imag", "view_as_real", "view_as_complex", "alias_copy",
    "detach", "contiguous", "__getitem__", "ravel", "atleast_1d", "atleast_2d", "atleast_3d", "broadcast_to",
    "squeeze_copy", "T", "conj",
}


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _aliases_input(op, parts) -> bool:
    inp, args, kwargs = parts
    if not isinstance(inp, torch.Tensor) or inp.numel() == 0:
        return False
    try:
        with torch.no_grad():
            out = op(inp, *args, **kwargs)
    except Exception:  # noqa: BLE001 - the op refuses this sample; there is nothing to check
        return False
    outs = _tensors(out)
    return bool(outs) and all(o.untyped_storage().data_ptr() == inp.untyped_storage().data_ptr() for o in outs)


def run_variant(op, variant: str, inp, args, kwargs) -> dict:
    """Runs one variant of ``op`` on the side that holds ``inp``; returns what the judge compares."""
    if variant == "inplace":
        returned = op.inplace_variant(inp, *args, **kwargs)
        return {"mutated_input": inp, "returns_input": returned is inp}
    if variant in ("out", "out_resize"):
        expected = op.op(inp.clone() if isinstance(inp, torch.Tensor) else inp, *args, **kwargs)
        if not isinstance(expected, torch.Tensor):
            raise TypeError("out= is checked for ops with one tensor output")
        shape = expected.shape if variant == "out" else (0,)
        out = torch.empty(shape, dtype=expected.dtype, device=expected.device)
        returned = op.op(inp, *args, **kwargs, out=out)
        return {"out": out, "returns_out": returned is out}
    if variant == "view":
        outs = _tensors(op(inp, *args, **kwargs))
        shares = [o.untyped_storage().data_ptr() == inp.untyped_storage().data_ptr() for o in outs]
        with torch.no_grad():
            for o in outs:
                o.fill_(True if o.dtype == torch.bool else 7)
        return {"shares_input_storage": shares, "input_after_writing_through_the_view": inp}
    raise ValueError(f"variant={variant!r} (type=str): expected one of {', '.join(DESCRIPTIONS)}")


def make_samples(op, case) -> list:
    out = []
    for k, template in enumerate(templates(op, case, requires_grad=False, limit=TEMPLATES, processed_outputs=False)):
        parts = parts_of(template)
        if not isinstance(parts[0], torch.Tensor):
            continue
        chosen = []
        if op.inplace_variant is not None:
            chosen.append("inplace")
        if op.supports_out:
            chosen += ["out", "out_resize"]
        if _aliases_input(op, parts):
            chosen.append("view")
        for variant in chosen:
            out.append(make_sample(parts, f"{DESCRIPTIONS[variant]} (sample {k})", variant=variant))
    return out
