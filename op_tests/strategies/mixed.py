"""The ``mixed`` input strategy: operands of different dtypes, 0-d tensors and Python scalars.

OpInfo's samples give every operand the same dtype, so a backend that
promotes int32 x float16 to float32, or lets a Python float or a 0-d
float64 tensor widen a float16 result, passes them all. Each binary or
ternary op (and the concatenating ones, which promote too) runs with one
operand of the case's dtype and the other changed, in turn, to a tensor of
each other dtype, a 0-d tensor of it, and a Python int, float, bool and
complex (PyTorch's wrapped numbers). The reference's result dtype is what
``torch.result_type`` says for these operands, and the target must match
it; the judge checks dtype before values.
"""

from __future__ import annotations

import torch

from .templates import make_sample, parts_of, templates

PARTNERS = ("float16", "bfloat16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool", "complex64")
ZERO_D_PRIMARY_PARTNERS = ("float64", "int64", "float16")
SCALARS = (("Python int", 3), ("Python float", 0.5), ("Python bool", True), ("Python complex", 0.5 + 0.25j))
# Ops that take several tensors of possibly different dtypes and promote them, beyond the binary ufuncs.
PROMOTING = {"addcmul", "addcdiv", "lerp", "where", "clamp", "clip", "cat", "concat", "concatenate", "stack",
             "hstack", "vstack", "dstack", "column_stack", "row_stack", "masked_fill", "copysign", "heaviside",
             "isclose", "allclose", "dist", "xlogy", "special.xlog1py", "special.zeta", "polar", "complex",
             "nn.functional.mse_loss", "nn.functional.l1_loss", "true_divide", "floor_divide", "fmod", "remainder",
             "atan2", "hypot", "nextafter", "logaddexp", "logaddexp2", "maximum", "minimum", "fmax", "fmin", "add",
             "sub", "mul", "div", "pow", "float_power", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
             "bitwise_or", "bitwise_xor", "logical_and", "logical_or", "logical_xor", "ldexp", "index_add",
             "masked_scatter", "addmv", "addr", "baddbmm", "addbmm", "addmm"}
TEMPLATES = 2
SLOTS = 2


def applies(op) -> bool:
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo

    return isinstance(op, BinaryUfuncInfo) or op.name in PROMOTING


def _slots(parts, dtype: torch.dtype) -> list[tuple[str, object]]:
    """Where an operand of the case's dtype sits: ("arg", i), ("kwarg", name) or ("list", j)."""
    inp, args, kwargs = parts
    found: list[tuple[str, object]] = []
    if isinstance(inp, (list, tuple)):
        found += [("list", j) for j, t in enumerate(inp) if j and isinstance(t, torch.Tensor) and t.dtype == dtype]
    found += [("arg", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.dtype == dtype]
    found += [("kwarg", k) for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.dtype == dtype]
    return found[:SLOTS]


def _get(parts, slot):
    inp, args, kwargs = parts
    kind, where = slot
    return inp[where] if kind == "list" else args[where] if kind == "arg" else kwargs[where]


def _put(parts, slot, value):
    inp, args, kwargs = parts
    kind, where = slot
    if kind == "list":
        inp = type(inp)(value if j == where else t for j, t in enumerate(inp))
    elif kind == "arg":
        args = tuple(value if i == where else a for i, a in enumerate(args))
    else:
        kwargs = {**kwargs, where: value}
    return inp, args, kwargs


def _label(slot) -> str:
    kind, where = slot
    return {"list": f"input list element {where}", "arg": f"argument {where + 1}", "kwarg": f"argument {where}"}[kind]


def make_samples(op, case) -> list:
    dtype = getattr(torch, case.dtype)
    out = []
    for k, template in enumerate(templates(op, case, requires_grad=False, limit=TEMPLATES, processed_outputs=False)):
        parts = parts_of(template)
        for slot in _slots(parts, dtype):
            original = _get(parts, slot).detach()
            where = f"{_label(slot)}, sample {k}"
            for partner in PARTNERS:
                if partner == case.dtype:
                    continue
                other = getattr(torch, partner)
                out.append(make_sample(_put(parts, slot, original.to(other)),
                                       f"{case.dtype} with a {partner} tensor ({where})"))
                if original.numel() and original.dim():
                    out.append(make_sample(_put(parts, slot, original.reshape(-1)[0].to(other).clone()),
                                           f"{case.dtype} with a 0-d {partner} tensor ({where})"))
            for label, scalar in SCALARS:
                if isinstance(scalar, complex) and not (dtype.is_floating_point or dtype.is_complex):
                    continue
                out.append(make_sample(_put(parts, slot, scalar), f"{case.dtype} with a {label} ({where})"))
            inp = parts[0]
            if slot[0] != "list" and isinstance(inp, torch.Tensor) and inp.numel() and inp.dim():
                for partner in ZERO_D_PRIMARY_PARTNERS:
                    if partner == case.dtype:
                        continue
                    zero_d = inp.detach().reshape(-1)[0].clone()
                    moved = _put((zero_d, parts[1], parts[2]), slot, original.to(getattr(torch, partner)))
                    out.append(make_sample(moved, f"0-d {case.dtype} input with a {partner} tensor ({where})"))
    return out


def expected_dtype(parts) -> torch.dtype | None:
    """``torch.result_type`` of the sample's input and its first other operand, where that is defined."""
    inp, args, _ = parts
    other = next((a for a in args if isinstance(a, (torch.Tensor, bool, int, float, complex))), None)
    if not isinstance(inp, torch.Tensor) or other is None:
        return None
    try:
        return torch.result_type(inp, other)
    except (RuntimeError, TypeError):
        return None
