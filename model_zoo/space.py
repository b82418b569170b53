"""The configuration space: every entry times every axis value it supports.

For one entry the space is the product of its dtypes, batches, sizes,
(mode, steps) pairs, executions, attention implementations and size-knob
variants (the default, or one knob moved to one of its listed values). The
space is never materialised: ``enumerate_configs`` is a generator and
``count_configs`` multiplies lengths, so counting hundreds of thousands of
configurations takes well under a second once the registry is loaded.

``sample_configs`` draws a deterministic, stratified subset: first one
config per buildable architecture at the base axis values (float32, default
batch and size, train, eager, default attention), then one per buildable task
variant, then configs that spread evenly over every axis's values.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from typing import Any, Collection, Iterable, Iterator, Mapping

from . import registry
from .config import ModelConfig
from .registry import ModelEntry
from .status import is_buildable, load_status

AXES = ("dtype", "batch", "size", "mode", "execution", "attn", "knobs")


def _mode_steps(entry: ModelEntry) -> list[tuple[str, int]]:
    return [(m, entry.steps if m == "steps" else 0) for m in entry.modes]


def _knob_variants(entry: ModelEntry) -> list[dict[str, int]]:
    return [{}] + [{k: v} for k, values in entry.knob_values.items() for v in values]


def _knob_label(knobs: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def _axis_values(entry: ModelEntry, where: Mapping[str, Collection[Any]] | None = None) -> dict[str, list[Any]]:
    values: dict[str, list[Any]] = {
        "dtype": list(entry.dtypes), "batch": list(entry.batches), "size": list(entry.sizes),
        "mode": _mode_steps(entry), "execution": list(entry.executions), "attn": list(entry.attn),
        "knobs": _knob_variants(entry),
    }
    for axis, allowed in (where or {}).items():
        if axis not in values:
            raise ValueError(f"where={axis!r}: unknown axis (axes: {', '.join(AXES)})")
        allowed = set(allowed)
        if axis == "mode":
            values[axis] = [v for v in values[axis] if v[0] in allowed]
        elif axis == "knobs":
            values[axis] = [v for v in values[axis] if _knob_label(v) in allowed]
        else:
            values[axis] = [v for v in values[axis] if v in allowed]
    return values


def _make(entry: ModelEntry, choice: Mapping[str, Any]) -> ModelConfig:
    mode, steps = choice["mode"]
    return ModelConfig(arch=entry.name, dtype=choice["dtype"], batch=choice["batch"], size=choice["size"],
                       mode=mode, steps=steps, execution=choice["execution"], attn=choice["attn"], **choice["knobs"])


def _select(families: Iterable[str] | None, patterns: Iterable[str] | str | None,
            exclude: Iterable[str] | str | None = None) -> list[ModelEntry]:
    return list(registry.entries(patterns, exclude, families=families))


def enumerate_configs(families: Iterable[str] | None = None, patterns: Iterable[str] | str | None = None, *,
                      exclude: Iterable[str] | str | None = None,
                      where: Mapping[str, Collection[Any]] | None = None) -> Iterator[ModelConfig]:
    """Every configuration of the selected entries, lazily, in a stable order."""
    for entry in _select(families, patterns, exclude):
        values = _axis_values(entry, where)
        for combo in itertools.product(*(values[a] for a in AXES)):
            choice = dict(zip(AXES, combo))
            if entry.unsupported and not _supported(entry, choice):
                continue
            yield _make(entry, choice)


def _supported(entry: ModelEntry, choice: Mapping[str, Any]) -> bool:
    axes = {"dtype": choice["dtype"], "batch": choice["batch"], "size": choice["size"], "mode": choice["mode"][0],
            "execution": choice["execution"], "attn": choice["attn"], **choice["knobs"]}
    return entry.unsupported_reason(axes) is None


def count_configs(families: Iterable[str] | None = None, patterns: Iterable[str] | str | None = None, *,
                  exclude: Iterable[str] | str | None = None,
                  where: Mapping[str, Collection[Any]] | None = None) -> dict[str, Any]:
    """Counts per family and per axis value, computed without enumerating.

    Returns ``{"total", "entries", "architectures", "families": {family:
    {"total", "entries", "architectures", "axes": {axis: {value: count}}}},
    "axes": {axis: {value: count}}}``.
    """
    out: dict[str, Any] = {"total": 0, "entries": 0, "architectures": 0, "families": {}, "axes": {a: Counter() for a in AXES}}
    for entry in _select(families, patterns, exclude):
        values = _axis_values(entry, where)
        fam = out["families"].setdefault(entry.family, {"total": 0, "entries": 0, "architectures": 0,
                                                        "axes": {a: Counter() for a in AXES}})
        for bucket in (out, fam):
            bucket["entries"] += 1
            bucket["architectures"] += entry.variant_of is None
        if len(entry.unsupported) == 1 and set(entry.unsupported[0][0]) <= set(AXES) - {"knobs"}:
            _tally((out, fam), values, _product(values))
            _untally((out, fam), values, entry.unsupported[0][0])
        elif entry.unsupported:  # overlapping exclusions: count configs one by one
            for combo in itertools.product(*(values[a] for a in AXES)):
                choice = dict(zip(AXES, combo))
                if _supported(entry, choice):
                    _tally((out, fam), {a: [choice[a]] for a in AXES}, 1)
        else:
            _tally((out, fam), values, _product(values))
    out["axes"] = {a: dict(c) for a, c in out["axes"].items()}
    for fam in out["families"].values():
        fam["axes"] = {a: dict(c) for a, c in fam["axes"].items()}
    return out


def _tally(buckets: tuple[dict[str, Any], ...], values: dict[str, list[Any]], total: int) -> None:
    """Adds ``total`` configs, spread evenly over ``values`` (a product), to each bucket."""
    if not total:
        return
    for bucket in buckets:
        bucket["total"] += total
        for axis in AXES:
            share = total // len(values[axis])
            for v in values[axis]:
                bucket["axes"][axis][_label(axis, v)] += share


def _untally(buckets: tuple[dict[str, Any], ...], values: dict[str, list[Any]], rule: Mapping[str, Any]) -> None:
    """Removes the configs one exclusion rule (a product of axis-value sets) takes out of ``values``."""
    hit = {a: [v for v in values[a] if _label(a, v) in rule[a]] if a in rule else values[a] for a in AXES}
    excluded = _product(hit)
    if not excluded:
        return
    for bucket in buckets:
        bucket["total"] -= excluded
        for axis in AXES:
            share = excluded // len(hit[axis])
            for v in hit[axis]:
                bucket["axes"][axis][_label(axis, v)] -= share


def _base_choice(values: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The cheapest, best-surveyed point: first value of each axis, preferring float32 / train / eager / default."""
    if not all(values[a] for a in AXES):
        return None
    prefer = {"dtype": "float32", "execution": "eager", "attn": "default"}
    choice = {}
    for axis in AXES:
        options = values[axis]
        if axis == "mode":
            choice[axis] = next((v for v in options if v[0] == "train"), options[0])
        elif axis in prefer:
            choice[axis] = prefer[axis] if prefer[axis] in options else options[0]
        else:
            choice[axis] = options[0]
    return choice


def sample_configs(n: int, seed: int, families: Iterable[str] | None = None,
                   patterns: Iterable[str] | str | None = None, *, exclude: Iterable[str] | str | None = None,
                   where: Mapping[str, Collection[Any]] | None = None,
                   status: Mapping[str, Mapping[str, Any]] | None = None,
                   include_unknown: bool = True) -> list[ModelConfig]:
    """A deterministic stratified subset of at least ``n`` configs (more if coverage needs it).

    Every buildable architecture (status ``ok`` in the shipped status file, or
    absent from it when ``include_unknown``) appears at least once, so the
    result has ``max(n, buildable architectures)`` configs when the space is
    large enough. The same arguments give the same list in every process.
    """
    if n < 0:
        raise ValueError(f"n={n!r} (type={type(n).__name__}): expected a non-negative int")
    status = load_status() if status is None else status
    rng = random.Random(f"model_zoo.sample:{seed}")
    eligible = [e for e in _select(families, patterns, exclude)
                if is_buildable(e.name, dict(status), unknown=include_unknown)]
    values_of = {e.name: _axis_values(e, where) for e in eligible}
    eligible = [e for e in eligible if all(values_of[e.name][a] for a in AXES)]

    chosen: dict[str, ModelConfig] = {}

    def take(cfg: ModelConfig) -> None:
        chosen.setdefault(cfg.config_id, cfg)

    # 1. every architecture once (its primary entry when buildable, else its first buildable variant)
    by_arch: dict[str, list[ModelEntry]] = defaultdict(list)
    for e in eligible:
        by_arch[e.architecture].append(e)
    for arch in sorted(by_arch):
        group = sorted(by_arch[arch], key=lambda e: (e.variant_of is not None, e.name))
        take(_make(group[0], _base_supported(group[0], values_of[group[0].name])))
    # 2. every task variant once, while the budget lasts
    variants = [e for e in eligible if e.variant_of is not None]
    rng.shuffle(variants)
    for e in variants:
        if len(chosen) >= n:
            break
        take(_make(e, _base_supported(e, values_of[e.name])))
    # 3. spread the rest over the axes: each draw takes each axis's least-used value the entry offers
    used: dict[str, Counter] = {a: Counter() for a in AXES}
    for cfg in chosen.values():
        for axis, label in _labels(cfg).items():
            used[axis][label] += 1
    space_size = sum(_product(values_of[e.name]) for e in eligible)
    target = min(n, space_size)
    order = list(eligible)
    misses = 0
    while len(chosen) < target and order and misses < 50 * len(order) + 1000:
        rng.shuffle(order)
        for e in order:
            if len(chosen) >= target:
                break
            choice = {}
            for axis in AXES:
                options = values_of[e.name][axis]
                labels = [_label(axis, v) for v in options]
                low = min(used[axis][lab] for lab in labels)
                choice[axis] = rng.choice([v for v, lab in zip(options, labels) if used[axis][lab] == low])
            if e.unsupported and not _supported(e, choice):
                misses += 1
                continue
            cfg = _make(e, choice)
            if cfg.config_id in chosen:
                misses += 1
                continue
            take(cfg)
            for axis, label in _labels(cfg).items():
                used[axis][label] += 1
    return list(chosen.values())


def base_configs(families: Iterable[str] | None = None, patterns: Iterable[str] | str | None = None, *,
                 exclude: Iterable[str] | str | None = None) -> list[ModelConfig]:
    """One base configuration (float32, default batch and size, train, eager) per selected entry.

    Unlike ``sample_configs`` this ignores the survey: an entry that does not
    build still gets its config, so a run over it states why (a ``skip`` with
    its reason) instead of leaving it out. This is how coverage figures such
    as "timm architectures passing train forward+backward" are measured.
    """
    out = []
    for entry in _select(families, patterns, exclude):
        values = _axis_values(entry)
        if all(values[a] for a in AXES):
            out.append(_make(entry, _base_supported(entry, values)))
    return out


def _base_supported(entry: ModelEntry, values: dict[str, list[Any]]) -> dict[str, Any]:
    """The base choice, or the first supported combination when the base one is excluded."""
    choice = _base_choice(values)
    if not entry.unsupported or _supported(entry, choice):
        return choice
    for combo in itertools.product(*(values[a] for a in AXES)):
        alt = dict(zip(AXES, combo))
        if _supported(entry, alt):
            return {**choice, **{a: alt[a] for a in AXES if a in ("mode", "attn")}} \
                if _supported(entry, {**choice, "mode": alt["mode"], "attn": alt["attn"]}) else alt
    return choice


def _label(axis: str, value: Any) -> Any:
    return value[0] if axis == "mode" else _knob_label(value) if axis == "knobs" else value


def _labels(cfg: ModelConfig) -> dict[str, Any]:
    return {"dtype": cfg.dtype, "batch": cfg.batch, "size": cfg.size, "mode": cfg.mode, "execution": cfg.execution,
            "attn": cfg.attn, "knobs": _knob_label(cfg.knobs())}


def _product(values: dict[str, list[Any]]) -> int:
    total = 1
    for axis in AXES:
        total *= len(values[axis])
    return total
