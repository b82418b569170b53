"""Operator case sources: PyTorch's OpInfo database and hypothesis strategies.

One case is one (OpInfo entry, dtype, direction): all of that entry's
``reference_inputs`` (which begin with its ``sample_inputs``) run inside it,
so a sweep has one result per op x dtype x direction, and a crash is confined
to the op that caused it. Every dtype the op supports on CPU is covered;
backward covers the floating and complex dtypes with autograd support.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass

import torch

from conformance.case import Case

from .catalogue import OpEntry, load_or_build

DIRECTIONS = ("forward", "backward")
DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "bcomplex32",
)


class UnknownOpError(ValueError):
    """An --ops pattern that matches no op; the message lists close names."""


@functools.lru_cache(maxsize=1)
def op_db():
    """PyTorch's OpInfo database (imported on first use: it takes seconds)."""
    import logging
    import warnings

    # Importing the test utilities probes for CUDA and logs about it; that is noise here.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db as db
    return tuple(db)


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, OpEntry]:
    """What selecting cases needs of every OpInfo entry, by key in op_db's order (op_tests/catalogue.py): read
    from the file kept for this torch, so that selecting does not import op_db (built from it the first time)."""
    return {e.key: e for e in load_or_build(lambda: [entry_of(op) for op in op_db()])}


def entry_of(op) -> OpEntry:
    """An OpInfo entry as case selection sees it."""
    from .strategies import STRATEGIES, strategy

    dtypes = tuple(sorted(dtype_name(d) for d in op.supported_dtypes("cpu")))
    return OpEntry(
        key=op_key(op), name=op.name, variant=op.variant_test_name, dtypes=dtypes,
        backward_dtypes=tuple(d for d in dtypes if supports_backward(op, getattr(torch, d))),
        elementwise=elementwise_kind(op),
        strategy_dtypes=tuple((name, direction, tuple(strategy(name).dtypes(op, dtypes, direction)))
                              for name in STRATEGIES for direction in DIRECTIONS),
    )


def op_key(op) -> str:
    """``name`` or ``name.variant``: unique across op_db."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.lru_cache(maxsize=1)
def op_index() -> dict:
    return {op_key(op): op for op in op_db()}


def get_op(key: str):
    try:
        return op_index()[key]
    except KeyError:
        raise UnknownOpError(_unknown_message(key)) from None


def case_op(case: Case):
    """The OpInfo entry an op case runs: its name, with its OpInfo variant where it has one."""
    return get_op(f"{case.name}.{case.category}" if case.category else case.name)


def sample_seed(case: Case, index: int) -> int:
    """The seed of a case's sample ``index``: distinct per sample, and the same wherever the sample runs
    (the case, the reference probe, the shrinker, the reproducer), so each replays the same draws."""
    return case.seed * 100_003 + index


def _unknown_message(pattern: str) -> str:
    import difflib

    close = difflib.get_close_matches(pattern, list(catalogue()), n=4)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"no op matches {pattern!r}{hint}"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def to_dtype(name: str) -> torch.dtype:
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r} (dtypes: {', '.join(DTYPE_NAMES)})")
    return getattr(torch, name)


def supports_backward(op, dtype: torch.dtype) -> bool:
    return (
        op.supports_autograd
        and (dtype.is_floating_point or dtype.is_complex)
        and dtype in op.supported_backward_dtypes("cpu")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSelection:
    """What ``--ops``, ``--dtypes`` and directions select."""

    patterns: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()  # empty: every dtype the op supports
    directions: tuple[str, ...] = DIRECTIONS
    max_samples: int = 0  # 0: all samples
    seed: int = 0
    hypothesis_examples: int = 16  # per element-wise op x float dtype x direction; 0: none
    strategies: tuple[str, ...] = ()  # input strategies (op_tests/strategies): () none; see STRATEGIES


def select_ops(patterns=("*",), exclude=()) -> list[OpEntry]:
    """The catalogue's entries whose key matches any pattern and no exclusion (op_db is not imported)."""
    entries = catalogue()
    chosen = []
    for pattern in patterns:
        matched = [k for k in entries if fnmatch.fnmatchcase(k, pattern)]
        if not matched:
            raise UnknownOpError(_unknown_message(pattern))
        chosen.extend(matched)
    chosen = [k for k in dict.fromkeys(chosen) if not any(fnmatch.fnmatchcase(k, e) for e in exclude)]
    return [entries[k] for k in chosen]


def op_cases(selection: OpSelection = OpSelection()) -> list[Case]:
    for d in selection.dtypes:
        to_dtype(d)
    for d in selection.directions:
        if d not in DIRECTIONS:
            raise ValueError(f"unknown direction {d!r} (directions: {', '.join(DIRECTIONS)})")
    cases = []
    for entry in select_ops(selection.patterns, selection.exclude):
        for name in entry.dtypes:
            if selection.dtypes and name not in selection.dtypes:
                continue
            for direction in selection.directions:
                if direction == "backward" and name not in entry.backward_dtypes:
                    continue
                config = {"source": "opinfo"}
                if selection.max_samples:
                    config["max_samples"] = selection.max_samples
                cases.append(
                    Case(kind="op", name=entry.name, category=entry.variant, dtype=name, mode=direction,
                         config=config, seed=selection.seed)
                )
    return cases


HYPOTHESIS_DTYPES = ("float32", "float64", "float16", "bfloat16")


def elementwise_kind(op) -> str | None:
    """"unary" or "binary" for element-wise ufunc OpInfos, else None."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, UnaryUfuncInfo

    if isinstance(op, UnaryUfuncInfo):
        return "unary"
    if isinstance(op, BinaryUfuncInfo):
        return "binary"
    return None


def hypothesis_cases(selection: OpSelection = OpSelection()) -> list[Case]:
    """Element-wise ops on shapes, layouts, broadcasting and special values that OpInfo misses."""
    if not selection.hypothesis_examples:
        return []
    cases = []
    for entry in select_ops(selection.patterns, selection.exclude):
        if entry.elementwise is None:
            continue
        for name in HYPOTHESIS_DTYPES:
            if name not in entry.dtypes or (selection.dtypes and name not in selection.dtypes):
                continue
            for direction in selection.directions:
                if direction == "backward" and name not in entry.backward_dtypes:
                    continue
                cases.append(Case(kind="op", name=entry.name, category=entry.variant, dtype=name, mode=direction,
                                  config={"source": "hypothesis", "examples": selection.hypothesis_examples},
                                  seed=selection.seed))
    return cases


def strategy_cases(selection: OpSelection = OpSelection()) -> list[Case]:
    """One case per op x dtype x direction x input strategy, for the dtypes each strategy covers."""
    from .strategies import strategy
    from .rules import strategy_exclusion

    chosen = [strategy(name) for name in selection.strategies]
    if not chosen:
        return []
    for d in selection.directions:
        if d not in DIRECTIONS:
            raise ValueError(f"unknown direction {d!r} (directions: {', '.join(DIRECTIONS)})")
    cases = []
    for entry in select_ops(selection.patterns, selection.exclude):
        for chosen_strategy in chosen:
            if strategy_exclusion(entry.key, chosen_strategy.name):
                continue
            for direction in selection.directions:
                for name in entry.dtypes_for(chosen_strategy.name, direction):
                    if selection.dtypes and name not in selection.dtypes:
                        continue
                    if direction == "backward" and name not in entry.backward_dtypes:
                        continue
                    cases.append(Case(kind="op", name=entry.name, category=entry.variant, dtype=name,
                                      mode=direction, config={"source": "family", "inputs": chosen_strategy.name},
                                      seed=selection.seed))
    return cases


def all_cases(selection: OpSelection = OpSelection()) -> list[Case]:
    return op_cases(selection) + hypothesis_cases(selection) + strategy_cases(selection)
