"""Error metrics between two float tensors of the same shape.

All metrics are computed in float64 on the CPU over finite elements (NaN and
inf positions are checked separately by the comparison).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

INT_VIEW = {  # the integer dtype of each float dtype's width: bit patterns, ULPs
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    **{d: torch.int8 for d in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)},
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorMetrics:
    numel: int
    mismatched: int  # elements outside (rtol, atol)
    max_abs: float
    max_abs_index: tuple[int, ...]
    max_rel: float
    max_rel_index: tuple[int, ...]
    max_ulp: float
    rmse: float

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatched / self.numel if self.numel else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mismatch_fraction"] = self.mismatch_fraction
        d["max_abs_index"] = list(self.max_abs_index)
        d["max_rel_index"] = list(self.max_rel_index)
        return d


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    if not shape:
        return ()
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), shape))


def ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two tensors of one float dtype (float64 result)."""
    int_dtype = INT_VIEW.get(actual.dtype)
    if int_dtype is None:
        return torch.zeros(actual.shape, dtype=torch.float64)

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.contiguous().view(int_dtype).to(torch.int64)
        sign_mask = (1 << (torch.iinfo(int_dtype).bits - 1)) - 1
        magnitude = bits & sign_mask
        return torch.where(bits < 0, -magnitude, magnitude)

    return (ordered(actual).to(torch.float64) - ordered(expected).to(torch.float64)).abs()


def tensor_metrics(actual: torch.Tensor, expected: torch.Tensor, *, rtol: float, atol: float) -> TensorMetrics:
    """Metrics of ``actual`` against ``expected`` (same shape and float dtype, on the CPU)."""
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(e)
    diff = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    rel = torch.where(finite & (e != 0), diff / e.abs(), torch.where(diff > 0, torch.full_like(a, float("inf")), diff))
    rel = torch.where(finite, rel, torch.zeros_like(rel))
    allowed = atol + rtol * e.abs()
    mismatched = int(((diff > allowed) & finite).sum())
    numel = a.numel()
    if numel == 0:
        return TensorMetrics(
            numel=0, mismatched=0, max_abs=0.0, max_abs_index=(), max_rel=0.0, max_rel_index=(), max_ulp=0.0, rmse=0.0
        )
    abs_flat = int(diff.reshape(-1).argmax())
    rel_flat = int(rel.reshape(-1).argmax())
    if actual.dtype in INT_VIEW and actual.dtype == expected.dtype:
        ulps = torch.where(finite, ulp_distance(actual.detach(), expected.detach()), torch.zeros_like(a))
        max_ulp = float(ulps.max())
    else:
        max_ulp = 0.0
    n_finite = int(finite.sum())
    rmse = float(torch.sqrt((diff**2).sum() / n_finite)) if n_finite else 0.0
    return TensorMetrics(
        numel=numel,
        mismatched=mismatched,
        max_abs=float(diff.reshape(-1)[abs_flat]),
        max_abs_index=_unravel(abs_flat, a.shape),
        max_rel=float(rel.reshape(-1)[rel_flat]),
        max_rel_index=_unravel(rel_flat, a.shape),
        max_ulp=max_ulp,
        rmse=rmse,
    )


def rmse(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    finite = torch.isfinite(a) & torch.isfinite(e)
    if not bool(finite.any()):
        return 0.0
    return float(torch.sqrt(((a - e)[finite] ** 2).mean()))
