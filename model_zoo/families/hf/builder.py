"""Builds a transformers model from a tiny config: scale down, fix up, construct, finish, make inputs."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from ...built import BuiltModel, cast_inputs, finish_model, input_generator, output_loss, sgd_factory
from ...config import ModelConfig
from ...errors import ModelBuildError
from ...registry import ModelEntry
from . import fixups
from .inputs import InputContext, generic_inputs, signature_params
from .scale_down import Plan, add_mrope_sections, scale_down_dict

ATTN_NAMES = {"eager": "eager", "sdpa": "sdpa", "flex": "flex_attention"}
IMAGE_MODALITIES = ("image", "image+text", "video", "video+text")


def plan_for(config: ModelConfig, entry: ModelEntry) -> Plan:
    image = config.size if entry.modality in IMAGE_MODALITIES else Plan().image
    return Plan(layers=config.layers or 2, hidden=config.hidden or 32, heads=config.heads or 4,
                experts=config.experts or 4, image=image)


def make_hf_config(model_type: str, plan: Plan, size: int, modality: str, *, mrope: bool = False) -> Any:
    """The tiny config for ``model_type``: defaults, the generic scale-down, then the family's fix-ups."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    plan = fixups.fix_plan(model_type, plan)
    base = fixups.base_config(model_type, cls).to_dict()
    data = scale_down_dict(base, plan)
    if mrope:
        add_mrope_sections(data, plan)
    fixups.fix_config_dict(model_type, data, plan, size=size, modality=modality, orig=base)
    cfg = cls.from_dict(data)
    fixups.fix_config(model_type, cfg, plan, size=size, modality=modality)
    return cfg


def build_hf(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    from .catalog import model_class

    meta = entry.meta
    task, class_name = meta.get("task"), meta.get("class_name")
    if not class_name:
        raise ModelBuildError(f"{entry.name}: no model class for config type {meta['model_type']!r} "
                              "(a sub-config that only a parent model builds)")
    if meta.get("unavailable"):
        raise ModelBuildError(f"{entry.name}: {meta['unavailable']}")
    model_cls = model_class(meta["module"], class_name)
    if model_cls is None:
        raise ModelBuildError(f"{entry.name}: cannot import {class_name}")
    plan = plan_for(config, entry)
    if meta.get("mrope") and config.heads is None:
        plan = replace(plan, heads=2)  # three M-RoPE sections need at least 3 rotary pairs, even at partial rotary
    hf_config = make_hf_config(meta["model_type"], plan, config.size, entry.modality, mrope=bool(meta.get("mrope")))
    kwargs: dict[str, Any] = {}
    if config.attn != "default":
        kwargs["attn_implementation"] = ATTN_NAMES[config.attn]
    model = fixups.construct(meta["model_type"], model_cls, hf_config, kwargs)
    hf_config = getattr(model, "config", hf_config)  # the (sub-)config the model was built from
    model = finish_model(model, config)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    params = signature_params(model)
    shared: dict[str, Any] = {}  # what every step's inputs share (allowed ids, placeholder counts)

    def batch(step: int) -> dict[str, Any]:
        ctx = InputContext(model=model, config=hf_config, task=task, model_type=meta["model_type"], batch=config.batch,
                           size=config.size, modality=entry.modality, gen=input_generator(config, step), params=params,
                           cache=shared)
        inputs = fixups.make_inputs(ctx, generic_inputs)
        return cast_inputs(inputs, dtype) if dtype is not None else inputs

    inputs = batch(0)
    if not inputs:
        raise ModelBuildError(f"{entry.name}: no input rule for forward({', '.join(params)})")
    notes = f"{class_name} from a tiny {type(hf_config).__name__}"
    return BuiltModel(model=model, inputs=inputs, loss_fn=output_loss, optimizer_factory=sgd_factory,
                      modality=entry.modality, notes=notes, config=config, batch_fn=batch)
