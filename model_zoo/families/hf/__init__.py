"""transformers: every config type in the auto mappings, built from a tiny config with random weights.

Entry names are ``hf/<model_type>`` for the type's primary model (its base
model, else its first task head) and ``hf/<model_type>:<task>`` for every other
task head the auto mappings list (``hf/gpt2:causal_lm``,
``hf/bert:sequence_classification``). Names come from the shipped catalog
(``catalog.py``), so listing imports nothing from transformers.
"""

from __future__ import annotations

from typing import Iterator

from ...registry import ModelEntry, register_family
from .builder import build_hf
from .catalog import load_catalog

FLEX_NO_BACKWARD = "FlexAttention has no backward on CPU in this torch; train with attn=sdpa or attn=eager"

SIZES = {"text": (16, 32), "image": (32, 64), "image+text": (32, 64), "video": (32, 64), "video+text": (32, 64),
         "audio": (16, 32), "audio+text": (16, 32), "time_series": (16, 32), "other": (16, 32)}


@register_family("hf")
def hf_entries() -> Iterator[ModelEntry]:
    for model_type, record in sorted(load_catalog()["types"].items()):
        tasks = record.get("tasks") or {None: None}
        primary = record.get("primary")
        for task, class_name in tasks.items():
            is_primary = task == primary or primary is None
            name = f"hf/{model_type}" if is_primary else f"hf/{model_type}:{task}"
            modality = (record.get("modality") or {}).get(task) or "other"
            knobs = {"layers": (1, 4), "hidden": (64,), "heads": (2,)}
            if record.get("moe"):
                knobs["experts"] = (2, 8)
            attn = tuple((record.get("attn") or {}).get(task) or ("default",))
            unsupported = ((({"attn": ("flex",), "mode": ("train", "steps")}, FLEX_NO_BACKWARD),) if "flex" in attn else ())
            yield ModelEntry(
                name=name, modality=modality, builder=build_hf, tasks=(task,) if task else (),
                attn=attn, unsupported=unsupported,
                sizes=SIZES.get(modality, (16, 32)), batches=(2, 1), knob_values=knobs,
                variant_of=None if is_primary else f"hf/{model_type}",
                meta={"model_type": model_type, "task": task, "class_name": class_name, "module": record.get("module"),
                      "subconfig": record.get("subconfig", False), "mrope": record.get("mrope", False),
                      "unavailable": (record.get("unavailable") or {}).get(task)},
            )
