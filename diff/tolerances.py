"""Tolerance policy: per-dtype defaults plus overrides kept in data.

Defaults are torch.testing.assert_close's (rtol, atol) per dtype. The
float64 golden rule multiplier follows PyTorch's benchmark accuracy check
(``torch/_dynamo/utils.py`` ``same()``): the target may be up to ``m`` times
as far from the float64 answer as the CPU reference is, m = 2, or 3 for
float16 / bfloat16 and for tiny tensors. Overrides live in
``diff/data/tolerance_overrides.json``; every override must say why.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

OVERRIDES_FILE = Path(__file__).with_name("data") / "tolerance_overrides.json"

# torch.testing.assert_close defaults, by dtype name.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
    "complex32": (1e-3, 1e-5),
    "complex64": (1.3e-6, 1e-5),
    "complex128": (1e-7, 1e-7),
    "float8_e4m3fn": (1.25e-1, 1e-3),
    "float8_e5m2": (2.5e-1, 1e-3),
    # The fnuz variants have the same mantissa widths (no inf, one NaN, no -0), so the same tolerances.
    "float8_e4m3fnuz": (1.25e-1, 1e-3),
    "float8_e5m2fnuz": (2.5e-1, 1e-3),
}
LOW_PRECISION = frozenset({"float16", "bfloat16", "complex32", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                           "float8_e5m2fnuz"})
SMALL_TENSOR = 10  # elements: the golden rule gets a larger multiplier below this


class ToleranceError(ValueError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    rtol: float
    atol: float
    multiplier: float = 2.0  # golden rule: target error <= multiplier * reference error (+ floor)
    reason: str = "torch.testing defaults"

    def describe(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}, golden multiplier {self.multiplier:g} ({self.reason})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Override:
    scope: str  # "op" or "model"
    pattern: str  # fnmatch pattern over op names or model families/architectures
    dtype: str  # dtype name or "*"
    rtol: float | None
    atol: float | None
    multiplier: float | None
    reason: str


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def default_tolerance(dtype) -> Tolerance:
    name = _dtype_name(dtype)
    rtol, atol = DEFAULT_TOLERANCES.get(name, (0.0, 0.0))
    return Tolerance(rtol=rtol, atol=atol, multiplier=3.0 if name in LOW_PRECISION else 2.0)


def load_overrides(path: Path = OVERRIDES_FILE) -> tuple[Override, ...]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ToleranceError(f"tolerance overrides {path}: {exc}") from None
    overrides = []
    for i, item in enumerate(data.get("overrides", [])):
        where = f"{path.name} entry {i}"
        if not str(item.get("reason", "")).strip():
            raise ToleranceError(f"{where}: every override needs a reason")
        scope = item.get("scope", "op")
        if scope not in ("op", "model"):
            raise ToleranceError(f"{where}: scope={scope!r} (type=str): expected op or model")
        if "pattern" not in item:
            raise ToleranceError(f"{where}: missing 'pattern'")
        overrides.append(
            Override(
                scope=scope,
                pattern=item["pattern"],
                dtype=item.get("dtype", "*"),
                rtol=item.get("rtol"),
                atol=item.get("atol"),
                multiplier=item.get("multiplier"),
                reason=item["reason"],
            )
        )
    return tuple(overrides)


@lru_cache(maxsize=1)
def _default_overrides() -> tuple[Override, ...]:
    return load_overrides()


class TolerancePolicy:
    """Looks up the tolerance for (scope, name, dtype): later overrides win."""

    def __init__(self, overrides: tuple[Override, ...] | None = None) -> None:
        self.overrides = _default_overrides() if overrides is None else overrides

    def lookup(self, name: str, dtype, *, scope: str = "op") -> Tolerance:
        dtype_name = _dtype_name(dtype)
        tol = default_tolerance(dtype_name)
        for o in self.overrides:
            if o.scope != scope or not fnmatch.fnmatchcase(name, o.pattern):
                continue
            if o.dtype != "*" and o.dtype != dtype_name:
                continue
            tol = Tolerance(
                rtol=tol.rtol if o.rtol is None else float(o.rtol),
                atol=tol.atol if o.atol is None else float(o.atol),
                multiplier=tol.multiplier if o.multiplier is None else float(o.multiplier),
                reason=o.reason,
            )
        return tol

    def for_dtype(self, name: str, *, scope: str = "op"):
        """A dtype -> Tolerance function for one op or model, as compare() takes."""
        return lambda dtype: self.lookup(name, dtype, scope=scope)
