"""Per-op comparison rules, from ``op_tests/data/op_rules.json``.

Most ops are compared by value. Random ops are compared by distribution,
uninitialised outputs by metadata, and randomized factorizations
(svd_lowrank) by a property that does not depend on the random draw.

Index outputs follow PyTorch's documentation on ties, quoted in each rule's
reason: where it allows any of the tied elements (sort without stable=True,
topk, median, ...), the indices are replaced by the input values they
select, so a backend that breaks ties differently is not failed for it;
where it promises one (argmax and max(dim): the first occurrence; sort with
stable=True: the input's order), the indices are compared exactly, so a
backend that breaks the promise is. The ``ties`` input strategy
(op_tests/strategies/ties.py) gives these ops samples with ties.
"""

from __future__ import annotations

import copy
import fnmatch
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

RULES_FILE = Path(__file__).with_name("data") / "op_rules.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatherSpec:
    dim_position: int
    dim_default: int | None
    keepdim_position: int | None
    keepdim_default: bool
    index_output: int | None  # position in the output tuple; None: the output is the index
    exact_when: tuple[tuple[str, object], ...] = ()  # keyword arguments under which the docs promise the order


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRule:
    compare: str  # values | distribution | metadata
    reason: str = ""
    gather: GatherSpec | None = None
    cpu_arguments: tuple[int, ...] = ()  # positions in args the op's API wants on the CPU
    property: str | None = None  # a name in PROPERTIES: both sides' outputs are replaced by it
    op_key: str = ""


@functools.lru_cache(maxsize=1)
def _rules() -> dict:
    data = json.loads(RULES_FILE.read_text())
    for section in ("distribution", "metadata", "gather_indices", "exact_indices", "cpu_arguments", "input_strategies",
                    "properties", "device_resolved"):
        for entry in data.get(section, []):
            if not entry.get("reason"):
                raise ValueError(f"{RULES_FILE.name}: every {section} entry needs a reason ({entry.get('pattern')})")
    return data


def strategy_exclusion(op_key: str, strategy: str) -> str | None:
    """Why an input strategy does not apply to an op (op_rules.json "input_strategies"), or None."""
    for entry in _rules().get("input_strategies", []):
        if fnmatch.fnmatchcase(op_key, entry["pattern"]) and strategy in entry["strategies"]:
            return entry["reason"]
    return None


def rule_for(op_key: str) -> OpRule:
    import dataclasses

    rule = _compare_rule(op_key)
    for entry in _rules().get("cpu_arguments", []):
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            return dataclasses.replace(rule, cpu_arguments=tuple(entry["positions"]))
    return rule


def _compare_rule(op_key: str) -> OpRule:
    data = _rules()
    for entry in data["distribution"]:
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            rule = "distribution_channels" if entry.get("draws") == "channels" else "distribution"
            return OpRule(compare=rule, reason=entry["reason"])
    for entry in data.get("properties", []):
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            if entry["property"] not in PROPERTIES:
                raise ValueError(f"{RULES_FILE.name}: unknown property {entry['property']!r} for {entry['pattern']}")
            return OpRule(compare="values", reason=entry["reason"], property=entry["property"], op_key=op_key)
    for entry in data["metadata"]:
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            return OpRule(compare="metadata", reason=entry["reason"])
    for entry in data.get("exact_indices", []):
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            return OpRule(compare="values", reason=entry["reason"])
    for entry in data["gather_indices"]:
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            keepdim = entry.get("keepdim")
            return OpRule(
                compare="values",
                reason=entry["reason"],
                gather=GatherSpec(
                    dim_position=entry["dim"][0],
                    dim_default=entry["dim"][1],
                    keepdim_position=keepdim[0] if keepdim else None,
                    keepdim_default=bool(keepdim[1]) if keepdim else True,
                    index_output=entry["index_output"],
                    exact_when=tuple(entry.get("exact_when", {}).items()),
                ),
            )
    return OpRule(compare="values")


def _linear_cross_entropy_acc_policy(inp, kwargs: dict, device_type: str) -> dict:
    """``options.acc_policy="auto"`` as LinearCrossEntropyOptions documents it for ``device_type``: "accurate" for
    float16 and bfloat16 input on the CPU, "compact" otherwise."""
    import dataclasses

    options = kwargs.get("options")
    if options is None or getattr(options, "acc_policy", None) != "auto" or not isinstance(inp, torch.Tensor):
        return kwargs
    low = inp.dtype in (torch.float16, torch.bfloat16)
    policy = "accurate" if device_type == "cpu" and low else "compact"
    return {**kwargs, "options": dataclasses.replace(options, acc_policy=policy)}


RESOLVERS = {"linear_cross_entropy_acc_policy": _linear_cross_entropy_acc_policy}


def resolved_for_device(op_key: str, samples: list, device_type: str) -> list:
    """The samples with the keyword arguments PyTorch resolves by device type made explicit, as the target's
    device resolves them (op_rules.json "device_resolved"): the reference, its golden and the target then run
    the one algorithm PyTorch documents for the target, and a reproducer shows it. Other ops' samples as given."""
    for entry in _rules().get("device_resolved", []):
        if fnmatch.fnmatchcase(op_key, entry["pattern"]):
            resolve = RESOLVERS.get(entry["resolver"])
            if resolve is None:
                raise ValueError(f"{RULES_FILE.name}: unknown resolver {entry['resolver']!r} for {entry['pattern']}")
            out = []
            for sample in samples:
                kwargs = resolve(sample.input, dict(sample.kwargs), device_type)
                if kwargs != sample.kwargs:
                    sample = copy.copy(sample)
                    sample.kwargs = kwargs
                out.append(sample)
            return out
    return samples


def tie_contract(op_key: str) -> str | None:
    """What PyTorch's docs say about the op's indices of tied elements: "one" (a promised index, compared
    exactly), "any" (any tied index; compared by the values it selects), or None (no rule about ties)."""
    data = _rules()
    if any(fnmatch.fnmatchcase(op_key, e["pattern"]) for e in data.get("exact_indices", [])):
        return "one"
    if any(fnmatch.fnmatchcase(op_key, e["pattern"]) for e in data["gather_indices"]):
        return "any"
    return None


def _arg(args, kwargs, position: int | None, name: str, default):
    if name in kwargs:
        return kwargs[name]
    if position is not None and position < len(args):
        return args[position]
    return default


def gather_index_output(spec: GatherSpec, cpu_input: torch.Tensor, args, kwargs, output):
    """Replaces the index tensor in ``output`` by the input values it selects, unless the call has the keyword
    arguments under which the docs promise the order (``spec.exact_when``, sort's stable=True)."""
    if spec.exact_when and all(kwargs.get(name) == value for name, value in spec.exact_when):
        return output
    dim = _arg(args, kwargs, spec.dim_position, "dim", spec.dim_default)
    keepdim = _arg(args, kwargs, spec.keepdim_position, "keepdim", spec.keepdim_default) if spec.keepdim_position is not None else True
    if not isinstance(dim, int):
        dim = None

    def gathered(index: torch.Tensor) -> torch.Tensor:
        device = index.device  # keep the side's device, so the device check still sees it
        return _gather(index.detach().cpu()).to(device)

    def _gather(index: torch.Tensor) -> torch.Tensor:
        source = cpu_input.detach()
        if source.dim() == 0:
            return source.expand(index.shape).clone()
        if dim is None:
            return source.reshape(-1).take(index.reshape(-1)).reshape(index.shape)
        d = dim % source.dim()
        idx = index if keepdim or index.dim() == source.dim() else index.unsqueeze(d)
        values = source.take_along_dim(idx, d)
        return values if keepdim or index.dim() == source.dim() else values.squeeze(d)

    if spec.index_output is None:
        return gathered(output) if isinstance(output, torch.Tensor) else output
    if isinstance(output, (tuple, list)) and len(output) > spec.index_output:
        parts = list(output)
        parts[spec.index_output] = gathered(parts[spec.index_output])
        return tuple(parts)
    return output


def lowrank_property(output, inp, args, kwargs, op_key: str = ""):
    """(U, S, V) of a randomized low-rank factorization -> what does not depend on the random draw.

    OpInfo's svd_lowrank and pca_lowrank factor ``inp @ args[0].mT`` (minus
    ``M``; centered for pca unless ``center=False``). For a matrix of rank at
    most q the reconstruction U diag(S) V^H is unique: it is compared, with
    the Gram matrices U^H U and V^H V (the identity). Above rank q the
    randomized answer depends on the draw; what must hold is Eckart-Young
    within a factor: the residual at most LOWRANK_SLACK times the best rank-q
    residual, so its excess over that bound (zero on a right device) is
    compared instead. The backward pass goes through the reconstruction (or the
    excess); the Gram matrices are constant, so their gradients are left out.
    """
    if not (isinstance(output, (tuple, list)) and len(output) == 3) or not args:
        return output
    u, s, v = output
    q = s.shape[-1]
    matrix = inp @ args[0].mT
    if kwargs.get("M") is not None:
        matrix = matrix - kwargs["M"]
    if op_key.startswith("pca_lowrank") and kwargs.get("center", True):
        matrix = matrix - matrix.mean(dim=-2, keepdim=True)
    recon = (u * s.unsqueeze(-2).to(u.dtype)) @ v.mH
    grams = ((u.mH @ u).detach(), (v.mH @ v).detach())  # their gradients are rounding noise (they are constant)
    exact = matrix.detach().cpu().to(torch.complex128 if matrix.is_complex() else torch.float64)
    sigma = torch.linalg.svdvals(exact)
    if sigma.shape[-1] <= q or bool((sigma[..., q] <= 1e-6 * sigma[..., 0].clamp_min(1e-300)).all()):
        return (recon, *grams)
    best = sigma[..., q:].pow(2).sum(-1).sqrt()  # Eckart-Young: the best rank-q residual
    residual = torch.linalg.matrix_norm(matrix.to(recon.dtype) - recon)
    scale = torch.linalg.matrix_norm(exact).to(device=residual.device, dtype=residual.real.dtype)
    excess = torch.relu(residual - LOWRANK_SLACK * best.to(device=residual.device, dtype=residual.dtype)) / scale
    return (excess, *grams)


LOWRANK_SLACK = 3.0  # a randomized rank-q residual over the optimum: at most 2.03x over 200 draws of each OpInfo sample
PROPERTIES = {"lowrank": lowrank_property}
