"""The ``extremes`` input strategy: values at the edges of each dtype.

Accelerators narrow int64 to int32, compute integers in float32 (exact only
up to 2^24), flush denormals, drop NaN and lose the sign of zero. OpInfo's
values are moderate, so none of that shows. Each template runs with every
other element of its tensors of the case's dtype replaced, in turn, by:

- integers: the dtype's minimum and maximum (and their neighbours, 0, +-1);
  values above 2^24; for 64-bit integers, values beyond 2^31 (int32's range)
  up to 2^62, where overflow and wrap-around differ between int32 and int64;
- floating point: the largest finite value; tiny and denormal values and
  -0.0; +-inf and NaN; values above 2^24 (and 2^31) that float32 cannot hold
  exactly;
- complex: the floating classes on both the real and the imaginary part.

The untouched half keeps the template's values, so an op with a restricted
domain still sees valid inputs next to the extreme ones. Tensors of another
dtype (indices, masks) are left alone.
"""

from __future__ import annotations

import torch

from .templates import make_sample, parts_of, replace_values, templates

TEMPLATES = 2


def integer_classes(dtype: torch.dtype) -> list[tuple[str, list[int]]]:
    info = torch.iinfo(dtype)
    classes = [("integer minimum and maximum", [info.min, info.max, info.min + 1, info.max - 1, 0, 1]
                + ([-1] if info.min < 0 else []))]
    if info.max >= 2**31 - 1:
        above = [2**24 + 1, 2**24 + 3, 2**25 + 1, 16_777_217 * 3]
        classes.append(("values above 2^24", above + ([-(2**24) - 1] if info.min < 0 else [])))
    if info.max > 2**31 - 1:
        beyond = [v for v in (2**31, 2**31 + 7, 2**32 + 3, 2**40 + 5, 2**53 + 1, 2**62 + 9) if v <= info.max]
        classes.append(("values beyond int32 (2^31 and up)",
                        beyond + ([-(2**31) - 1, -(2**40) - 3] if info.min < 0 else [])))
    return classes


def float_classes(dtype: torch.dtype) -> list[tuple[str, list[float]]]:
    info = torch.finfo(dtype)
    subnormal = info.smallest_normal * info.eps  # the smallest positive subnormal
    classes = [
        ("largest finite values", [info.max, -info.max, info.max / 2, 1.0]),
        ("tiny and denormal values, -0.0", [info.smallest_normal, -info.smallest_normal, subnormal,
                                            info.smallest_normal / 4, -0.0, 0.0]),
        ("infinities and NaN", [float("inf"), float("-inf"), float("nan"), -0.0, 1.0]),
    ]
    if info.max > 2**32:
        classes.append(("values above 2^24", [2.0**24 + 1, -(2.0**24) - 3, 2.0**31 + 1, 2.0**40 + 3]))
    return classes


def value_classes(dtype: torch.dtype) -> list[tuple[str, list]]:
    if dtype == torch.bool:
        return []
    if dtype.is_complex:
        return float_classes({torch.complex32: torch.float16, torch.complex64: torch.float32}.get(dtype, torch.float64))
    if dtype.is_floating_point:
        return float_classes(dtype)
    return integer_classes(dtype)


def _with_values(t: torch.Tensor, values: list, shift: int) -> torch.Tensor:
    """``t`` with every other element (starting at ``shift % 2``) cycling through ``values``."""
    out = t.detach().clone()
    flat = out.view(-1)
    positions = torch.arange(shift % 2, flat.numel(), 2)
    if not len(positions):
        return out
    picks = [values[(i + shift) % len(values)] for i in range(len(positions))]
    if t.is_complex():
        real = torch.tensor(picks, dtype=torch.float64)
        imag = torch.tensor([values[(i + shift + 1) % len(values)] for i in range(len(positions))],
                            dtype=torch.float64)
        fill = torch.complex(real, imag).to(t.dtype)
    else:
        fill = torch.tensor(picks, dtype=torch.float64 if t.is_floating_point() else torch.int64) \
            if t.dtype != torch.uint64 else torch.tensor([min(p, 2**63 - 1) for p in picks], dtype=torch.int64)
        fill = fill.to(t.dtype)
    flat[positions] = fill
    return out


def make_samples(op, case) -> list:
    backward = case.mode == "backward"
    dtype = getattr(torch, case.dtype)
    classes = value_classes(dtype)
    out = []
    for k, template in enumerate(templates(op, case, requires_grad=backward, limit=TEMPLATES)):
        parts = parts_of(template)
        for name, values in classes:
            moved = replace_values(parts, dtype, lambda index, t, values=values: _with_values(t, values, index))
            if moved is not None:
                out.append(make_sample(moved, f"{name} (sample {k})", like=template))
    return out
