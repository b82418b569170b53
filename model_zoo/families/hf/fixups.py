"""Per-family knowledge: what the generic shrink and the generic inputs get wrong, by model type.

Each table maps a model type (or a tuple of them) to a small function:

* ``BASE``: builds the default config where ``Config()`` alone does not work;
* ``DICT``: edits the shrunk config dict before the config is rebuilt;
* ``CONFIG``: edits the rebuilt config object;
* ``INPUTS``: returns the inputs, given the context and the generic rule.

Keep each fix small and say why it is needed.
"""

from __future__ import annotations

from typing import Any, Callable

from .inputs import InputContext
from .shrink import Plan

BASE: dict[str, Callable[[type], Any]] = {}
DICT: dict[str, Callable[..., None]] = {}
CONFIG: dict[str, Callable[..., None]] = {}
INPUTS: dict[str, Callable[[InputContext, Callable[[InputContext], dict]], dict]] = {}


def _for(table: dict, *types: str) -> Callable:
    def decorate(fn: Callable) -> Callable:
        for t in types:
            if t in table:
                raise ValueError(f"fix-up for {t!r} in {fn.__name__} is already defined")
            table[t] = fn
        return fn

    return decorate


def base_config(model_type: str, cls: type) -> Any:
    return BASE[model_type](cls) if model_type in BASE else cls()


def fix_config_dict(model_type: str, data: dict[str, Any], plan: Plan, *, size: int, modality: str) -> None:
    if model_type in DICT:
        DICT[model_type](data, plan, size=size, modality=modality)


def fix_config(model_type: str, cfg: Any, plan: Plan, *, size: int, modality: str) -> None:
    if model_type in CONFIG:
        CONFIG[model_type](cfg, plan, size=size, modality=modality)


def construct(model_type: str, model_cls: type, cfg: Any, kwargs: dict[str, Any]) -> Any:
    return model_cls._from_config(cfg, **kwargs)


def make_inputs(ctx: InputContext, generic: Callable[[InputContext], dict]) -> dict[str, Any]:
    fn = INPUTS.get(ctx.model_type)
    return fn(ctx, generic) if fn else generic(ctx)
