"""Dropout neutralised for the layer comparison, so that the comparison is deterministic.

A model in training mode draws dropout masks; the reference and the target
draw different ones (different generators, or one generator at different
states), and a layer-by-layer comparison of masked values compares noise:
a 1% fault drowns in it, and the float64 golden rule, whose golden draws a
third mask, lets everything through. For the comparison only, every dropout
(``nn.Dropout`` and its functional forms, the attention dropouts of
``scaled_dot_product_attention`` and ``multi_head_attention_forward``, and
``rrelu``'s random slopes) runs as in evaluation, on every side. The
script's own run keeps its dropout; other random ops (``randn_like`` in a
VAE) are left alone and found by the reference-again run instead.
"""

from __future__ import annotations

import inspect
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# Functions that are the identity when not training.
_IDENTITY_WHEN_OFF = {
    F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
    torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
}
# Functions that keep running, with these arguments changed.
_OVERRIDES = {
    F.scaled_dot_product_attention: {"dropout_p": 0.0},
    F.multi_head_attention_forward: {"dropout_p": 0.0},
    F.rrelu: {"training": False},
}


@lru_cache(maxsize=None)
def _signature(func) -> inspect.Signature | None:
    try:
        return inspect.signature(func)
    except (TypeError, ValueError):
        return None


def _with(func, args: tuple, kwargs: dict, changes: dict):
    signature = _signature(func)
    if signature is None:
        return args, {**kwargs, **changes}
    bound = signature.bind(*args, **kwargs)
    bound.arguments.update(changes)
    return bound.args, bound.kwargs


class NeutralDropout(TorchFunctionMode):
    """Within this mode every dropout is off (see the module docstring), in eager code and in code
    torch.compile traces (dynamo inlines the mode). It keeps no state, so it never makes dynamo recompile."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _IDENTITY_WHEN_OFF:
            return args[0] if args else kwargs["input"]
        changes = _OVERRIDES.get(func)
        if changes is not None:
            args, kwargs = _with(func, args, kwargs, changes)
        return func(*args, **kwargs)
