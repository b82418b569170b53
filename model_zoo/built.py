"""``BuiltModel`` and the helpers every family's builder shares.

A built model is ready to run: on CPU, in the config's dtype, with weights
drawn from a fixed seed and every dropout neutralised, so that train mode is
as deterministic as eval mode and the reference and target sides of a
comparison see the same computation. Inputs come from a private generator
seeded by (config seed, step), never from the global RNG, so drawing a batch
does not disturb anything else and ``make_batch(step)`` is reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable

import torch

from .config import ModelConfig
from .errors import ModelBuildError

DTYPE_OF = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

LossFn = Callable[[Any, dict[str, Any]], torch.Tensor]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


@dataclass(slots=True, kw_only=True)
class BuiltModel:
    """A model, its inputs and how to train it; ``make_batch(step)`` draws batch ``step``.

    ``inputs`` is ``make_batch(0)``: keyword arguments for ``model(**inputs)``.
    ``loss_fn(outputs, inputs)`` returns a scalar: the model's own loss where
    it computes one from labels in ``inputs``, else a mean of squares of the
    floating outputs (a plain mean would give zero gradients through softmax
    or normalised outputs).
    """

    model: torch.nn.Module
    inputs: dict[str, Any]
    loss_fn: LossFn
    optimizer_factory: OptimizerFactory
    modality: str
    notes: str = ""
    config: ModelConfig | None = None
    batch_fn: Callable[[int], dict[str, Any]] | None = field(default=None, repr=False)

    def make_batch(self, step: int) -> dict[str, Any]:
        """Inputs for training step ``step``: deterministic, same shapes and distribution as ``inputs``."""
        if self.batch_fn is None:
            return dict(self.inputs)
        return self.batch_fn(step)


# seeds and generators ---------------------------------------------------------

def seed_everything(seed: int) -> None:
    """Seeds every RNG a model constructor might read (weights come from here)."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional for the zoo itself
        pass


def input_generator(config: ModelConfig, step: int) -> torch.Generator:
    """A private generator for batch ``step`` of ``config``; independent of the weight seed stream."""
    return torch.Generator().manual_seed((config.seed * 1_000_003 + step * 7919 + 12345) % (2**63))


# model finishing --------------------------------------------------------------

def neutralise_dropout(model: torch.nn.Module) -> int:
    """Sets every dropout probability in ``model`` to zero; returns how many were set.

    Covers ``nn.Dropout*`` modules and the float attributes with "drop" in
    their name that attention layers, drop-path and layer-drop modules read
    at call time (``attention_dropout``, ``drop_prob``, ``layerdrop`` ...).
    """
    count = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) or isinstance(module, torch.nn.Dropout):
            if module.p:
                module.p = 0.0
                count += 1
        for name, value in list(vars(module).items()):
            if "drop" in name.lower() and isinstance(value, float) and not isinstance(value, bool) and value > 0:
                setattr(module, name, 0.0)
                count += 1
        if isinstance(module, torch.nn.MultiheadAttention) and module.dropout:
            module.dropout = 0.0
            count += 1
    return count


def finish_model(model: torch.nn.Module, config: ModelConfig) -> torch.nn.Module:
    """Dropout off, cast to the config's dtype, put in the config's mode; returns ``model``."""
    neutralise_dropout(model)
    model = model.to(dtype=DTYPE_OF[config.dtype])
    model.train(config.mode != "eval")
    return model


def left_behind_by_to(model: torch.nn.Module) -> list[str]:
    """Modules with weights that ``model.to(device)`` leaves where they are: held in a plain list, tuple or dict
    attribute instead of an ``nn.ModuleList``/``ModuleDict``, so they are not submodules (transformers'
    OneFormerTransformerModule.input_projections). Such a model runs on no device but the CPU, and its
    optimizer never sees those weights: a property of the model, known before any backend runs it.
    Returns ``"input_projections (3 Conv2d)"``-style names; a plain container of registered submodules is fine."""
    registered = {id(m) for m in model.modules()}
    found = []
    for prefix, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr.startswith("_") or not isinstance(value, (list, tuple, dict)):
                continue
            items = value.values() if isinstance(value, dict) else value
            stray = [m for m in items if isinstance(m, torch.nn.Module) and id(m) not in registered
                     and any(True for _ in m.parameters())]
            if stray:
                kinds = ", ".join(sorted({type(m).__name__ for m in stray}))
                found.append(f"{prefix + '.' if prefix else ''}{attr} ({len(stray)} {kinds})")
    return found


def cast_inputs(inputs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """Floating tensors (also inside lists and dicts) cast to ``dtype``; others unchanged."""

    def cast(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.is_floating_point() else value
        if isinstance(value, dict):
            return {k: cast(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v) for v in value)
        return value

    return {k: cast(v) for k, v in inputs.items()}


# losses and optimizers --------------------------------------------------------

def float_leaves(value: Any, _depth: int = 0) -> list[torch.Tensor]:
    """Floating tensors in a nested output (tensors, sequences, mappings, dataclasses, ModelOutputs)."""
    if _depth > 8 or value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in float_leaves(v, _depth + 1)]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [t for v in value for t in float_leaves(v, _depth + 1)]
    if is_dataclass(value) and not isinstance(value, type):
        return [t for f in fields(value) for t in float_leaves(getattr(value, f.name, None), _depth + 1)]
    return []


def output_loss(outputs: Any, inputs: dict[str, Any] | None = None) -> torch.Tensor:
    """The model's own ``loss`` if it returned one, else the sum of mean squares of its float outputs.

    Only outputs that carry gradient count when any do, so an integer or
    detached side output does not make the loss constant.
    """
    own = getattr(outputs, "loss", None) if not isinstance(outputs, torch.Tensor) else None
    if own is None and isinstance(outputs, Mapping):
        own = outputs.get("loss")
    if isinstance(own, torch.Tensor) and own.is_floating_point():
        return own.float().mean() if own.ndim else own.float()
    return mean_square_loss(outputs)


def mean_square_loss(outputs: Any, inputs: dict[str, Any] | None = None) -> torch.Tensor:
    """Sum over the float outputs of ``mean(x**2)``, computed in float32."""
    leaves = float_leaves(outputs)
    with_grad = [t for t in leaves if t.requires_grad]
    leaves = with_grad or leaves
    if not leaves:
        raise ModelBuildError("the model returned no floating-point output to reduce to a loss")
    total = None
    for t in leaves:
        if t.numel() == 0:
            continue
        t = t.real if t.is_complex() else t
        t = t.float()
        t = torch.where(torch.isfinite(t), t, torch.zeros((), dtype=t.dtype))  # masked logits are -inf by design
        term = t.pow(2).mean()
        total = term if total is None else total + term
    if total is None:
        raise ModelBuildError("every floating-point output of the model is empty")
    return total


def sgd_factory(params: Any) -> torch.optim.Optimizer:
    """The zoo's fixed optimizer: SGD, lr 1e-2, momentum 0.9 (stable in every dtype, unlike Adam's eps in float16)."""
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9)
