"""Hypothesis strategies for what OpInfo samples miss.

Small composable generators: shapes (0-d, empty, rank up to 6), layouts
(contiguous, non-contiguous, transposed, expanded, channels-last),
broadcasting partners, and special values (NaN, +-inf, -0.0, denormals,
huge and tiny numbers). A strategy draws a :class:`TensorSpec`, a plain
value whose repr rebuilds it and whose ``build()`` makes the tensor
deterministically, so a failing example can be reproduced from its repr.

Examples for a case are drawn with a fixed seed and no example database
(:func:`draw_examples`), so the same case always sees the same examples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

LAYOUTS = ("contiguous", "noncontiguous", "transposed", "expanded", "channels_last")
SPECIALS = ("nan", "inf", "-inf", "-0.0", "denormal", "huge", "tiny")
MAX_RANK = 6
MAX_NUMEL = 4096

# Register a database-free, derandomized profile for CI runs of the property tests.
settings.register_profile("ci", database=None, derandomize=True, deadline=None,
                          suppress_health_check=list(HealthCheck))


def _special_value(name: str, dtype: torch.dtype) -> float:
    info = torch.finfo(dtype)
    return {
        "nan": math.nan,
        "inf": math.inf,
        "-inf": -math.inf,
        "-0.0": -0.0,
        "denormal": info.smallest_normal / 4,
        "huge": info.max / 2,
        "tiny": info.smallest_normal * 2,
    }[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """A tensor described by value: ``TensorSpec(...).build()`` makes it."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    layout: str = "contiguous"
    specials: tuple[str, ...] = ()
    seed: int = 0
    scale: float = 3.0

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} (type=str): expected one of {', '.join(LAYOUTS)}")
        unknown = set(self.specials) - set(SPECIALS)
        if unknown:
            raise ValueError(f"specials={self.specials!r} (type=tuple): unknown {sorted(unknown)}; known {SPECIALS}")
        if len(self.shape) > MAX_RANK:
            raise ValueError(f"shape={self.shape!r} (type=tuple): rank {len(self.shape)} > {MAX_RANK}")

    def build(self, device="cpu") -> torch.Tensor:
        dtype = getattr(torch, self.dtype)
        gen = torch.Generator().manual_seed(self.seed)
        shape = self.shape
        if self.layout == "expanded" and shape:
            base_shape = (1,) + tuple(shape[1:])
            values = self._values(base_shape, dtype, gen)
            return values.to(device).expand(shape)
        if self.layout == "transposed" and len(shape) >= 2:
            stored = shape[:-2] + (shape[-1], shape[-2])
            return self._values(stored, dtype, gen).to(device).transpose(-1, -2)
        if self.layout == "noncontiguous" and shape:
            wide = shape[:-1] + (shape[-1] * 2,)
            return self._values(wide, dtype, gen).to(device)[..., ::2]
        if self.layout == "channels_last" and len(shape) == 4:
            return self._values(shape, dtype, gen).to(device).contiguous(memory_format=torch.channels_last)
        return self._values(shape, dtype, gen).to(device)

    def _values(self, shape, dtype, gen) -> torch.Tensor:
        values = torch.randn(shape, generator=gen, dtype=torch.float64) * self.scale
        flat = values.view(-1)
        if self.specials and flat.numel():
            picks = torch.randint(0, len(self.specials), (flat.numel(),), generator=gen)
            mask = torch.rand(flat.numel(), generator=gen) < 0.3
            for i, name in enumerate(self.specials):
                flat[(picks == i) & mask] = _special_value(name, dtype)
        return values.to(dtype)


def shapes(max_rank: int = MAX_RANK, max_side: int = 5) -> st.SearchStrategy[tuple[int, ...]]:
    """0-d to rank ``max_rank``, including empty dimensions, at most MAX_NUMEL elements."""
    return st.lists(st.integers(0, max_side), min_size=0, max_size=max_rank).map(tuple).filter(
        lambda s: math.prod(s) <= MAX_NUMEL
    )


def tensor_specs(dtype: str, *, shape=None, layouts=LAYOUTS, with_specials: bool = True):
    specials = st.lists(st.sampled_from(SPECIALS), max_size=3, unique=True).map(tuple) if with_specials else st.just(())
    return st.builds(
        TensorSpec,
        shape=shapes() if shape is None else st.just(shape),
        dtype=st.just(dtype),
        layout=st.sampled_from(layouts),
        specials=specials,
        seed=st.integers(0, 2**31 - 1),
        scale=st.sampled_from([1e-3, 1.0, 3.0, 1e3]),
    )


def broadcastable_to(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes that broadcast with ``shape``: a suffix of it, with some sides set to 1."""

    @st.composite
    def _draw(draw):
        keep = draw(st.integers(0, len(shape)))
        suffix = list(shape[len(shape) - keep:])
        return tuple(1 if side and draw(st.booleans()) else side for side in suffix)

    return _draw()


def binary_specs(dtype: str) -> st.SearchStrategy[tuple[TensorSpec, TensorSpec]]:
    """A pair of tensors that broadcast with each other, either side the larger."""

    @st.composite
    def _draw(draw):
        first = draw(tensor_specs(dtype))
        other_shape = draw(broadcastable_to(first.shape))
        second = draw(tensor_specs(dtype, shape=other_shape))
        return (first, second) if draw(st.booleans()) else (second, first)

    return _draw()


def draw_examples(strategy: st.SearchStrategy, n: int, seed: int) -> list:
    """``n`` examples of ``strategy``, the same ones for the same seed, with no database."""
    drawn: list = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        if len(drawn) < n:
            drawn.append(example)

    collect()
    return drawn
