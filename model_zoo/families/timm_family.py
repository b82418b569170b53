"""timm: every model in ``timm.list_models()``, random weights, small inputs.

The names and each model's tiny defaults come from ``data/timm_models.json``,
written by ``python -m model_zoo.families.timm_probe`` for the installed timm:
the smallest square input that trains (found by a forward on the meta device),
the ``img_size`` a fixed-size model must be built with, and, for models over
the parameter cap, the depth kwargs that scale them down (``depth=2`` for
ViT-style models, one block per stage for staged ones) so that a CI subset
over all of timm fits its time budget. A shrunk model is the same
architecture with fewer blocks; its entry says so (``meta['shrunk']``).
When the installed timm differs from the one probed, the family falls back to
live listing at the native input size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ..built import BuiltModel, cast_inputs, finish_model, input_generator, output_loss, sgd_factory
from ..config import ModelConfig
from ..errors import ModelBuildError
from ..registry import ModelEntry, register_family
from .shipped import load_shipped

DATA = Path(__file__).resolve().parent.parent / "data" / "timm_models.json"
NUM_CLASSES = 10
DROP_KWARGS = {"drop_rate": 0.0, "drop_path_rate": 0.0}


def load_catalog() -> dict[str, Any]:
    """The probed catalog for the installed timm, or a live listing (native sizes) when it is stale."""
    return load_shipped(DATA, "timm", empty={"version": None, "models": {}}, stale=_live_listing)


def _live_listing(version: str) -> dict[str, Any]:
    import timm

    return {"version": version, "live": True,
            "models": {name: {"sizes": [224], "batches": [2], "kwargs": {}} for name in timm.list_models()}}


@register_family("timm")
def timm_entries() -> Iterator[ModelEntry]:
    for name, info in sorted(load_catalog()["models"].items()):
        if info.get("error"):
            # The probe could not construct it; register anyway so the survey records why.
            info = {**info, "sizes": info.get("sizes") or [224]}
        knob_values = {"layers": (1, 4)} if info.get("depth_kwarg") else {}
        yield ModelEntry(
            name=f"timm/{name}", modality="image", builder=build_timm, tasks=("image_classification",),
            attn=("default", "eager", "sdpa") if info.get("fused_attn") else ("default",),
            sizes=tuple(info.get("sizes") or [224]), batches=tuple(info.get("batches") or [2]),
            knob_values=knob_values, meta=info,
        )


def build_timm(config: ModelConfig, entry: ModelEntry) -> BuiltModel:
    import timm
    import torch

    info = entry.meta
    name = entry.arch
    kwargs: dict[str, Any] = dict(info.get("kwargs") or {})
    if config.size != entry.default_size and "img_size" in kwargs:
        kwargs["img_size"] = config.size
    if config.layers is not None:
        kwargs[info["depth_kwarg"]] = config.layers
    try:
        model = timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kwargs)
    except RuntimeError as exc:
        if "Unknown model" in str(exc):
            raise ModelBuildError(f"{entry.name}: not in the installed timm") from None
        raise
    notes = []
    if info.get("shrunk"):
        notes.append(f"shrunk from {info.get('native_params', 0) / 1e6:.0f}M params with {info['shrunk']}")
    if config.attn != "default":
        fused = config.attn == "sdpa"
        for module in model.modules():
            if isinstance(getattr(module, "fused_attn", None), bool):
                module.fused_attn = fused
        notes.append(f"attention modules set to fused_attn={fused}")
    model = finish_model(model, config)
    channels = int(info.get("in_chans") or 3)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)

    def batch(step: int) -> dict[str, Any]:
        gen = input_generator(config, step)
        x = torch.randn(config.batch, channels, config.size, config.size, generator=gen)
        return cast_inputs({"x": x}, dtype)

    return BuiltModel(model=model, inputs=batch(0), loss_fn=classification_loss, optimizer_factory=sgd_factory,
                      modality="image", notes="; ".join(notes), config=config, batch_fn=batch)


def classification_loss(outputs: Any, inputs: dict[str, Any]) -> Any:
    """Cross-entropy against a label the input determines (the sign of its mean), so loss curves can fall.

    Falls back to the mean-square reduction for outputs that are not ``(batch, classes)`` logits.
    """
    import torch
    import torch.nn.functional as F

    x = inputs.get("x")
    if isinstance(outputs, torch.Tensor) and outputs.ndim == 2 and x is not None and outputs.shape[0] == x.shape[0]:
        labels = (x.float().mean(dim=tuple(range(1, x.ndim))) > 0).long() % outputs.shape[1]
        return F.cross_entropy(outputs.float(), labels)
    return output_loss(outputs, inputs)
