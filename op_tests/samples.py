"""An op case's samples: made on the CPU from OpInfo (or the hypothesis strategies), deterministic for the case's seed.

Samples are made on the CPU, not on the device under test: a device whose
random or creation ops are broken must fail those ops' cases, not the
generation of every other case. The reference cache may hold a case's
samples too (``cacheable_inputs`` / ``restore_samples``), keyed by a hash of
the code that makes them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from conformance.case import Case
from conformance.serialize import saves_exactly, value_bytes

from .sources import op_key, to_dtype


def generate_samples(op, case: Case) -> list:
    """The case's samples, made on the CPU, deterministic for its seed.

    Samples are made on the CPU, not on the device under test: a device whose
    random or creation ops are broken must fail those ops' cases, not the
    generation of every other case. The reference inputs begin with the
    sample inputs.
    """
    if case.config.get("source") == "hypothesis":
        return hypothesis_samples(op, case)
    if case.config.get("source") == "family":  # an input strategy's case (see strategies/)
        from .strategies import strategy_samples

        return strategy_samples(op, case)
    dtype = to_dtype(case.dtype)
    limit = int(case.config.get("max_samples", 0))
    torch.manual_seed(case.seed)
    samples = []
    for sample in op.reference_inputs("cpu", dtype, requires_grad=case.mode == "backward"):
        samples.append(sample)
        if limit and len(samples) >= limit:
            break
    return samples


def hypothesis_samples(op, case: Case) -> list:
    """Samples drawn from the strategies in op_tests/strategies/hypothesis_examples.py; each sample's name is its spec's repr."""
    from torch.testing._internal.opinfo.core import SampleInput

    from .sources import elementwise_kind
    from .strategies.hypothesis_examples import binary_specs, draw_examples, tensor_specs

    kind = elementwise_kind(op)
    strategy = tensor_specs(case.dtype) if kind == "unary" else binary_specs(case.dtype)
    backward = case.mode == "backward"
    # Extra arguments (mvlgamma's p, threshold's value, ...) come from the op's first OpInfo sample.
    torch.manual_seed(case.seed)
    template = next(iter(op.sample_inputs("cpu", to_dtype(case.dtype))), None)
    extra_args, extra_kwargs = (), {}
    if template is not None:
        own = 0 if kind == "unary" else 1  # binary ops: the first argument is the other operand
        extra_args = tuple(template.args[own:])
        extra_kwargs = dict(template.kwargs)
        if any(isinstance(v, torch.Tensor) for v in tree_leaves((extra_args, extra_kwargs))):
            raise HypothesisNotApplicable(f"{op_key(op)} needs tensor arguments the strategies do not make")

    def make(spec):
        t = spec.build()
        return t.detach().requires_grad_() if backward else t

    samples = []
    for example in draw_examples(strategy, int(case.config.get("examples", 16)), seed=case.seed):
        if kind == "unary":
            samples.append(SampleInput(make(example), args=extra_args, kwargs=extra_kwargs, name=repr(example)))
        else:
            samples.append(SampleInput(make(example[0]), args=(make(example[1]), *extra_args), kwargs=extra_kwargs,
                                       name=repr(example)))
    return samples


class HypothesisNotApplicable(ValueError):
    """The op needs arguments the hypothesis strategies do not generate."""


# ---------------------------------------------------------------- samples from the reference cache
_DEFAULT_OUTPUT_PROCESS = "SampleInput.__init__.<locals>.<lambda>"  # OpInfo's identity default
_generator_digest: str | None = None


def generator_digest() -> str:
    """A hash of the code that makes samples: cached inputs are reused only while it is unchanged."""
    global _generator_digest
    if _generator_digest is None:
        import hashlib
        from pathlib import Path

        h = hashlib.blake2b(digest_size=16)
        here = Path(__file__).parent
        for path in [here / "samples.py", here / "sources.py", *sorted((here / "strategies").glob("*.py"))]:
            h.update(path.read_bytes())
        _generator_digest = h.hexdigest()
    return _generator_digest


def cacheable_inputs(samples) -> list | None:
    """The samples as plain values the reference cache can store, or None when they cannot be rebuilt from it.

    A sample whose output needs its own processing function, or whose
    inputs are not plain dense tensors (each saved with its storage, offset
    and strides, see ``serialize.saves_exactly``) and simple values, is
    generated anew on every run instead.
    """
    out = []
    for sample in samples:
        if getattr(sample.output_process_fn_grad, "__qualname__", "") != _DEFAULT_OUTPUT_PROCESS:
            return None
        inp, args, kwargs = sample_parts(sample)
        for leaf in tree_leaves((inp, args, kwargs)):
            if isinstance(leaf, torch.Tensor) and (type(leaf) is not torch.Tensor or leaf.is_conj() or leaf.is_neg()
                                                   or not saves_exactly(leaf)):
                return None
        out.append({"input": inp, "args": list(args), "kwargs": kwargs, "name": sample.name,
                    "variant": sample_variant(sample)})
    return out


def restore_samples(entry) -> list | None:
    """The samples stored in a reference-cache entry, when it holds them for the current sample code."""
    if not isinstance(entry, dict) or entry.get("generator") != generator_digest():
        return None
    inputs = entry.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != len(entry.get("samples", ())):
        return None
    from .strategies.templates import make_sample

    return [make_sample((s["input"], s["args"], s["kwargs"]), s.get("name", ""), s.get("variant", "")) for s in inputs]


def sample_variant(sample) -> str:
    """"" for a plain call of the op; "inplace", "out", "out_resize" or "view" (strategies/variants.py)."""
    return getattr(sample, "variant", "")


def sample_parts(sample) -> tuple[Any, tuple, dict]:
    return sample.input, tuple(sample.args), dict(sample.kwargs)


def inputs_fingerprint(samples) -> str:
    """A hash of every sample's values, so a cached reference is only reused for the very same inputs."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for sample in samples:
        for leaf in tree_leaves(sample_parts(sample)):
            if isinstance(leaf, torch.Tensor):
                t = leaf.detach().cpu()
                if t.layout != torch.strided:  # sparse: fingerprint its dense values
                    h.update(f"{t.layout}".encode())
                    t = t.to_dense()
                h.update(f"{t.dtype}{tuple(t.shape)}{t.stride()}".encode())
                if t.layout == torch.strided:
                    h.update(value_bytes(t))
            else:
                h.update(repr(leaf).encode())
    return h.hexdigest()

