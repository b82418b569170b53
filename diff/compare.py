"""Compare nested outputs of a target against a reference, with a float64 golden.

The walk follows torch.testing.assert_close: an ordered list of pair types
(None, tensors, numbers, mappings, sequences, anything else by equality),
each of which may decline a pair, a path carried through the nesting
(``output[1]['values']``), and every problem collected before one verdict.

A float tensor passes when one of these holds, in order:

1. it is close to the CPU reference (rtol, atol of its dtype);
2. it is close to the float64 golden: a target more accurate than the CPU is
   never failed;
3. its RMSE against the golden is within ``multiplier`` times the reference's
   own RMSE against the golden, plus a floor of atol/10 (PyTorch's benchmark
   ``same()`` rule), so an op the CPU itself computes loosely is judged by the
   CPU's own error.

NaN and inf positions must match; integers and bools must be equal; dtype,
shape and device are checked for every tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .metrics import INT_VIEW, rmse, tensor_metrics, ulp_distance
from .tolerances import SMALL_TENSOR, Tolerance, default_tolerance

RULES = ("values", "distribution", "distribution_channels", "metadata")
CONSTANT_MIN_ELEMENTS = 8  # a reference this large and constant is a degenerate distribution; a 0-d draw is not
KS_C_ALPHA = 2.69  # two-sample Kolmogorov-Smirnov critical constant for alpha = 1e-6
KS_MIN_ELEMENTS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class Mismatch:
    path: str
    kind: str  # type | structure | device | dtype | shape | nonfinite | values | exact | distribution
    message: str
    metrics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"path": self.path, "kind": self.kind, "message": self.message, "metrics": self.metrics}


@dataclass(kw_only=True)
class Comparison:
    """Truthy when everything matched; carries per-leaf statistics either way."""

    mismatches: list[Mismatch] = field(default_factory=list)
    leaves: int = 0
    worst: dict[str, float] = field(default_factory=dict)
    passed_by: dict[str, int] = field(default_factory=dict)  # which rule let float leaves pass

    def __bool__(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        if not self.mismatches:
            return f"all {self.leaves} outputs match"
        first = self.mismatches[0]
        more = f" (+{len(self.mismatches) - 1} more)" if len(self.mismatches) > 1 else ""
        return f"{first.path}: {first.message}{more}"

    def report(self) -> str:
        if not self.mismatches:
            return self.summary()
        return "\n".join(f"{m.path}: {m.message}" for m in self.mismatches)

    def to_dict(self) -> dict:
        return {
            "ok": bool(self),
            "leaves": self.leaves,
            "worst": self.worst,
            "passed_by": self.passed_by,
            "mismatches": [m.to_dict() for m in self.mismatches],
        }

    def _note(self, key: str, value: float) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self.worst[key] = max(self.worst.get(key, 0.0), float(value))


ToleranceFn = Callable[[torch.dtype], Tolerance]


def compare(
    actual: Any,
    expected: Any,
    *,
    golden: Any = None,
    tolerance: Tolerance | ToleranceFn | None = None,
    device: str | torch.device | None = None,
    rule: str = "values",
    path: str = "output",
) -> Comparison:
    """Compares ``actual`` (target side) with ``expected`` (CPU reference).

    ``golden`` mirrors ``expected``'s structure with float64 results (or None).
    ``device``: the device type every actual tensor must be on (e.g. "neuron").
    ``rule``: "values" (default), "distribution" (random ops: shape, dtype and
    a two-sample test) or "metadata" (dtype, shape and device only).
    """
    if rule not in RULES:
        raise ValueError(f"rule={rule!r} (type=str): expected one of {', '.join(RULES)}")
    if tolerance is None:
        tol_fn: ToleranceFn = default_tolerance
    elif isinstance(tolerance, Tolerance):
        tol_fn = lambda _dtype, _t=tolerance: _t  # noqa: E731
    else:
        tol_fn = tolerance
    device_type = None if device is None else torch.device(device).type
    result = Comparison()
    _Walker(result, tol_fn, device_type, rule).walk(actual, expected, golden, path)
    return result


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


class _Walker:
    def __init__(self, result: Comparison, tol_fn: ToleranceFn, device_type: str | None, rule: str) -> None:
        self.result = result
        self.tol_fn = tol_fn
        self.device_type = device_type
        self.rule = rule

    def fail(self, path: str, kind: str, message: str, metrics: dict | None = None) -> None:
        self.result.mismatches.append(Mismatch(path=path, kind=kind, message=message, metrics=metrics or {}))

    # The pair types, in order; each returns True when it handled the pair.
    def walk(self, actual, expected, golden, path: str) -> None:
        for pair in (self._none, self._tensor, self._number, self._mapping, self._sequence):
            if pair(actual, expected, golden, path):
                return
        self.result.leaves += 1
        if actual != expected:
            self.fail(path, "values", f"{actual!r} != {expected!r} (reference)")

    def _none(self, actual, expected, golden, path) -> bool:
        if expected is not None and actual is not None:
            return False
        self.result.leaves += 1
        if (actual is None) != (expected is None):
            self.fail(path, "structure", f"got {type(actual).__name__}, the reference has {type(expected).__name__}")
        return True

    def _number(self, actual, expected, golden, path) -> bool:
        if not isinstance(expected, (bool, int, float, complex)) or isinstance(actual, torch.Tensor):
            return False
        if not isinstance(actual, (bool, int, float, complex)):
            self.result.leaves += 1
            self.fail(path, "type", f"got {type(actual).__name__}, the reference has {type(expected).__name__}")
            return True
        if isinstance(expected, bool) or isinstance(expected, int) and isinstance(actual, int):
            self.result.leaves += 1
            if actual != expected:
                self.fail(path, "exact", f"{actual!r} != {expected!r} (reference)")
            return True
        as_tensor = lambda v: None if v is None else torch.tensor(v, dtype=torch.complex128 if isinstance(v, complex) else torch.float64)  # noqa: E731
        self._tensor(as_tensor(actual), as_tensor(expected), as_tensor(golden) if isinstance(golden, (int, float, complex)) else None, path, check_device=False)
        return True

    def _mapping(self, actual, expected, golden, path) -> bool:
        if not isinstance(expected, Mapping):
            return False
        if not isinstance(actual, Mapping):
            self.result.leaves += 1
            self.fail(path, "type", f"got {type(actual).__name__}, the reference has a mapping")
            return True
        if set(actual) != set(expected):
            self.result.leaves += 1
            missing = sorted(map(str, set(expected) - set(actual)))
            extra = sorted(map(str, set(actual) - set(expected)))
            self.fail(path, "structure", f"keys differ: missing {missing}, extra {extra}")
            return True
        for key in expected:
            g = golden.get(key) if isinstance(golden, Mapping) else None
            self.walk(actual[key], expected[key], g, f"{path}[{key!r}]")
        return True

    def _sequence(self, actual, expected, golden, path) -> bool:
        if not isinstance(expected, Sequence) or isinstance(expected, (str, bytes)) or isinstance(expected, torch.Size):
            return False
        if not isinstance(actual, Sequence) or isinstance(actual, (str, bytes)):
            self.result.leaves += 1
            self.fail(path, "type", f"got {type(actual).__name__}, the reference has a sequence")
            return True
        if len(actual) != len(expected):
            self.result.leaves += 1
            self.fail(path, "structure", f"length {len(actual)}, the reference has {len(expected)}")
            return True
        for i, e in enumerate(expected):
            g = golden[i] if isinstance(golden, Sequence) and not isinstance(golden, (str, bytes)) and i < len(golden) else None
            self.walk(actual[i], e, g, f"{path}[{i}]")
        return True

    # ---------------------------------------------------------------- tensors
    def _tensor(self, actual, expected, golden, path, check_device: bool = True) -> bool:
        if not isinstance(expected, torch.Tensor):
            return False
        r = self.result
        r.leaves += 1
        if not isinstance(actual, torch.Tensor):
            self.fail(path, "type", f"got {type(actual).__name__}, the reference has a tensor")
            return True
        if check_device and self.device_type is not None and actual.device.type != self.device_type:
            self.fail(path, "device", f"output is on {actual.device}, expected the {self.device_type} device")
        if actual.dtype != expected.dtype:
            self.fail(path, "dtype", f"dtype {actual.dtype} != {expected.dtype} (reference)")
            return True
        if actual.shape != expected.shape:
            self.fail(path, "shape", f"shape {tuple(actual.shape)} != {tuple(expected.shape)} (reference)")
            return True
        if self.rule == "metadata":
            return True
        a, e = _plain(actual), _plain(expected)
        g = _plain(golden) if isinstance(golden, torch.Tensor) and golden.shape == expected.shape else None
        if self.rule.startswith("distribution"):
            self._distribution(a, e, path)
            return True
        if a.is_complex():
            a, e = torch.view_as_real(a), torch.view_as_real(e)
            g = torch.view_as_real(g) if g is not None and g.is_complex() else None
        if not a.is_floating_point():
            if not torch.equal(a, e):
                diff = (a != e)
                count = int(diff.sum())
                first = tuple(int(i) for i in diff.nonzero()[0]) if count else ()
                self.fail(
                    path,
                    "exact",
                    f"Mismatched elements: {count} / {a.numel()} ({100 * count / max(a.numel(), 1):.1f}%); "
                    f"first at index {first}: {a[first].item() if first or a.dim() == 0 else a.item()} != "
                    f"{e[first].item() if first or e.dim() == 0 else e.item()} (exact comparison for {expected.dtype})",
                    {"mismatched": count, "numel": a.numel()},
                )
            return True
        self._float(a, e, g, expected.dtype, path)
        return True

    def _float(self, a: torch.Tensor, e: torch.Tensor, g: torch.Tensor | None, dtype, path: str) -> None:
        r = self.result
        if _bitwise_equal(a, e):  # the common case, and the cheap one: no metrics to compute
            for key in ("max_abs", "max_rel", "max_ulp", "mismatch_fraction"):
                r._note(key, 0.0)
            self._passed("reference")
            return
        tol = self.tol_fn(dtype)
        wa, we = _with_nonfinite_kernels(a), _with_nonfinite_kernels(e)  # for the NaN/inf masks only
        nan_a, nan_e = torch.isnan(wa), torch.isnan(we)
        if g is not None and not torch.equal(nan_a, nan_e) and self._matches_golden(a, g, tol):
            # The CPU produced NaN or inf where float64 does not (or the reverse) and the target
            # agrees with float64: a target more accurate than the CPU is not failed.
            self._passed("golden")
            return
        if not torch.equal(nan_a, nan_e):
            extra = int((nan_a & ~nan_e).sum())
            missing = int((~nan_a & nan_e).sum())
            where = (nan_a ^ nan_e).nonzero()[0].tolist() if a.dim() else []
            self.fail(
                path,
                "nonfinite",
                f"NaN positions differ: {extra} NaN where the reference has a number, {missing} numbers where "
                f"the reference has NaN; first at index {tuple(where)}",
                {"extra_nan": extra, "missing_nan": missing},
            )
            return
        inf_a, inf_e = torch.isinf(wa), torch.isinf(we)
        if not torch.equal(inf_a, inf_e) or not torch.equal(wa[inf_a], we[inf_e]):
            bad = (inf_a ^ inf_e) | (inf_a & inf_e & (wa != we))
            where = bad.nonzero()[0].tolist() if a.dim() and bool(bad.any()) else []
            self.fail(path, "nonfinite", f"inf positions or signs differ at {int(bad.sum())} elements; first at index {tuple(where)}")
            return
        m = tensor_metrics(a, e, rtol=tol.rtol, atol=tol.atol)
        r._note("max_abs", m.max_abs)
        r._note("max_rel", m.max_rel if math.isfinite(m.max_rel) else 0.0)
        r._note("max_ulp", m.max_ulp)
        r._note("mismatch_fraction", m.mismatch_fraction)
        golden_note = ""
        if g is not None:
            rmse_t, rmse_r = rmse(a, g), rmse(e, g)
            r._note("rmse_target_golden", rmse_t)
            r._note("rmse_reference_golden", rmse_r)
        if m.mismatched == 0:
            self._passed("reference")
            return
        if g is not None:
            if tensor_metrics(a, g, rtol=tol.rtol, atol=tol.atol).mismatched == 0:
                self._passed("golden")
                return
            multiplier = tol.multiplier * (1.5 if a.numel() <= SMALL_TENSOR else 1.0)
            floor = tol.atol / 10
            if rmse_t <= multiplier * rmse_r + floor:
                self._passed("golden_rmse")
                return
            golden_note = (
                f"; float64 golden: target RMSE {rmse_t:.3g} vs reference RMSE {rmse_r:.3g} "
                f"(allowed {multiplier:g}x + {floor:.2g})"
            )
        msg = (
            f"Mismatched elements: {m.mismatched} / {m.numel} ({100 * m.mismatch_fraction:.1f}%); "
            f"greatest absolute difference {m.max_abs:.3g} at index {m.max_abs_index} (up to {tol.atol:g} allowed); "
            f"greatest relative difference {m.max_rel:.3g} at index {m.max_rel_index} (up to {tol.rtol:g} allowed); "
            f"max {m.max_ulp:.0f} ULP{golden_note}"
        )
        metrics = m.to_dict()
        if g is not None:
            metrics.update(rmse_target_golden=rmse_t, rmse_reference_golden=rmse_r)
        self.fail(path, "values", msg, metrics)

    def _matches_golden(self, a: torch.Tensor, g: torch.Tensor, tol: Tolerance) -> bool:
        g = g.to(a.dtype) if a.dtype != g.dtype and not a.is_floating_point() else g
        golden_in_dtype = g.to(a.dtype)  # float64 rounded to the target's dtype: its NaN/inf pattern there
        wa, wg = _with_nonfinite_kernels(a), _with_nonfinite_kernels(golden_in_dtype)
        if not torch.equal(torch.isnan(wa), torch.isnan(wg)):
            return False
        inf_a = torch.isinf(wa)
        if not torch.equal(inf_a, torch.isinf(wg)) or not torch.equal(wa[inf_a], wg[inf_a]):
            return False
        return tensor_metrics(a, g, rtol=tol.rtol, atol=tol.atol).mismatched == 0

    def _passed(self, how: str) -> None:
        self.result.passed_by[how] = self.result.passed_by.get(how, 0) + 1

    def _distribution(self, a: torch.Tensor, e: torch.Tensor, path: str) -> None:
        """Random outputs: same distribution, by a two-sample Kolmogorov-Smirnov test."""
        if a.is_complex():
            a, e = torch.view_as_real(a), torch.view_as_real(e)
        af, ef = _draws(a), _draws(e)
        if bool(torch.isnan(af).any()) != bool(torch.isnan(ef).any()):
            self.fail(path, "distribution", "NaN in one side's random output only")
            return
        af, ef = af[~torch.isnan(af)], ef[~torch.isnan(ef)]
        n, m = af.numel(), ef.numel()
        if self.rule == "distribution_channels" and a.dim() >= 2:
            # One random decision per (sample, channel): the elements of a channel are not independent draws.
            n = m = min(n, m, a.shape[0] * a.shape[1])
        if n < KS_MIN_ELEMENTS or m < KS_MIN_ELEMENTS:
            lo, hi = (float(ef.min()), float(ef.max())) if ef.numel() else (0.0, 0.0)
            if ef.numel() >= CONSTANT_MIN_ELEMENTS and af.numel() and lo == hi and not bool((af == lo).all()):
                self.fail(path, "distribution", f"reference is constant {lo:g}, target is not")
            return
        d = _ks_statistic(af, ef)
        critical = KS_C_ALPHA * math.sqrt((n + m) / (n * m))
        self.result._note("ks_statistic", d)
        if d > critical:
            self.fail(
                path,
                "distribution",
                f"random output differs in distribution: KS statistic {d:.3f} > {critical:.3f} "
                f"(target mean {float(af.mean()):.4g}, std {float(af.std()):.4g}; reference mean "
                f"{float(ef.mean()):.4g}, std {float(ef.std()):.4g})",
                {"ks_statistic": d, "ks_critical": critical},
            )


def _with_nonfinite_kernels(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or as float32 for the float8 dtypes, which have no isnan/isinf kernels.

    float32 holds every float8 value exactly, so the NaN/inf positions found
    in it are those of the float8 tensor.
    """
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _bitwise_equal(a: torch.Tensor, e: torch.Tensor) -> bool:
    bits = INT_VIEW.get(a.dtype)
    if bits is None or a.dtype != e.dtype:
        return False
    return torch.equal(a.contiguous().view(bits), e.contiguous().view(bits))


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def ks_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The two-sample Kolmogorov-Smirnov statistic of two random outputs (complex ones as pairs of reals, NaN left
    out), as the distribution rule computes it."""
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    af, bf = _draws(a), _draws(b)
    af, bf = af[~torch.isnan(af)], bf[~torch.isnan(bf)]
    return _ks_statistic(af, bf) if af.numel() and bf.numel() else 0.0


def _draws(t: torch.Tensor) -> torch.Tensor:
    """A random output's elements as one float64 row (complex ones viewed as pairs of reals first)."""
    return t.reshape(-1).to(torch.float64)


def _ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    a, _ = torch.sort(a)
    b, _ = torch.sort(b)
    grid = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, grid, right=True).to(torch.float64) / a.numel()
    cdf_b = torch.searchsorted(b, grid, right=True).to(torch.float64) / b.numel()
    return float((cdf_a - cdf_b).abs().max())


__all__ = ["Comparison", "Mismatch", "RULES", "compare", "ulp_distance"]
