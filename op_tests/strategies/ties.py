"""The ``ties`` input strategy: samples whose values tie, for ops that return indices of tied elements.

PyTorch documents which index such an op returns on ties (op_rules.json
quotes it): argmax, argmin and max/min(dim) the first occurrence, sort with
stable=True the input's order; topk, median and others any of the tied
elements. OpInfo's float samples almost never tie, so a backend that returns
the last tied index passes them all. Each template runs with its tensors of
the case's dtype replaced by:

- few distinct values: every element one of three, so rows tie at their
  maximum, minimum, median and k-th value, at seeded positions;
- all elements equal: every element ties (argmax's answer is 0).

Only ops with a rule about ties get cases (``rules.tie_contract``); backward
only where the docs promise the index, because only there is the gradient's
place promised too.
"""

from __future__ import annotations

import torch

from ..rules import tie_contract
from .templates import make_sample, parts_of, primary, replace_values, templates

TEMPLATES = 4
MIN_ELEMENTS = 4  # a template whose tensor is smaller has too little room for ties
FLOAT_VALUES = (-1.5, 0.5, 2.0)  # exact in every floating dtype
INT_VALUES = (0, 1, 2)  # valid in every integer dtype


def tie_dtypes(op, supported: tuple[str, ...], direction: str) -> tuple[str, ...]:
    # the op's key as sources.op_key spells it (sources imports the strategies, so they cannot import it)
    contract = tie_contract(f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name)
    if contract is None or (direction == "backward" and contract != "one"):
        return ()
    preferred = ("float32", "int64") if direction == "forward" else ("float32",)
    return tuple(d for d in preferred if d in supported)


def _tied(t: torch.Tensor, gen: torch.Generator, equal: bool) -> torch.Tensor:
    values = FLOAT_VALUES if t.is_floating_point() else INT_VALUES
    picks = torch.ones(t.shape, dtype=torch.int64) if equal else torch.randint(len(values), t.shape, generator=gen)
    return torch.tensor(values, dtype=t.dtype)[picks]


def make_samples(op, case) -> list:
    backward = case.mode == "backward"
    dtype = getattr(torch, case.dtype)
    gen = torch.Generator().manual_seed(case.seed)

    def roomy(sample) -> bool:
        x = primary(parts_of(sample))
        return x is not None and x.numel() >= MIN_ELEMENTS

    out = []
    for k, template in enumerate(templates(op, case, requires_grad=backward, limit=TEMPLATES, keep=roomy)):
        for name, equal in (("few distinct values", False), ("all elements equal", True)):
            moved = replace_values(parts_of(template), dtype, lambda index, t, equal=equal: _tied(t, gen, equal))
            if moved is not None:
                out.append(make_sample(moved, f"ties: {name} (sample {k})", like=template))
    return out
