"""The transformers catalog: every config type, its model classes per task, shipped as JSON.

    python -m model_zoo.families.hf.catalog [--out model_zoo/data/hf_models.json]

Listing the zoo must not import transformers (seconds) nor every modeling
module (a minute), so this script writes, for the installed transformers,
one record per config type in ``CONFIG_MAPPING``:

* ``tasks``: task -> model class, from the auto mappings (``MODEL_MAPPING`` is
  ``base``, ``MODEL_FOR_CAUSAL_LM_MAPPING`` is ``causal_lm`` ...), one task per
  distinct class; types no mapping lists (most sub-configs) get the classes
  of their modeling module whose ``config_class`` is theirs;
* ``subconfig``: whether another config type nests it (``sub_configs``), and
  which; the acceptance target counts only types that are not sub-configs;
* ``inputs``: the forward parameters of the primary class, from which the
  modality follows; ``attn``: the attention implementations the class
  declares; ``moe``: whether the config has experts.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from ..shipped import load_shipped

DATA = Path(__file__).resolve().parents[2] / "data" / "hf_models.json"

# The order in which a type's primary entry picks its task when it has no base model.
TASK_PRIORITY = (
    "base", "causal_lm", "masked_lm", "seq_to_seq_causal_lm", "speech_seq_2_seq", "image_text_to_text",
    "multimodal_lm", "image_classification", "ctc", "audio_classification", "sequence_classification",
)

INPUT_NAMES = ("input_ids", "pixel_values", "pixel_values_videos", "input_features", "input_values", "past_values",
               "decoder_input_ids", "attention_mask", "token_type_ids", "bbox", "image", "audio_values",
               "input_points", "input_boxes", "states", "spectrogram", "feature", "inputs_embeds", "labels",
               "future_values", "past_time_features", "past_observed_mask", "static_categorical_features",
               "pixel_mask", "visual_embeds", "input_embeds", "inputs", "x", "image_grid_thw", "video_grid_thw")


def task_of(mapping_name: str) -> str:
    if mapping_name == "MODEL_MAPPING_NAMES":
        return "base"
    return mapping_name.removeprefix("MODEL_FOR_").removesuffix("_MAPPING_NAMES").lower()


def modality_of(inputs: list[str], task: str) -> str:
    has = set(inputs)
    if "past_values" in has:
        return "time_series"
    if "pixel_values_videos" in has and "input_ids" not in has:
        return "video"
    if {"input_features", "input_values", "audio_values", "spectrogram"} & has:
        return "audio+text" if "input_ids" in has or "decoder_input_ids" in has else "audio"
    if {"pixel_values", "image"} & has:
        return "image+text" if "input_ids" in has else "image"
    if "pixel_values_videos" in has:
        return "video+text"
    if "input_ids" in has:
        return "text"
    return "other"


def model_class(module: str, name: str):
    """The class ``name`` from transformers or its model package; None when its import fails."""
    for where in ("transformers", module):
        try:
            obj = getattr(importlib.import_module(where), name, None)
        except Exception:  # noqa: BLE001 - a modeling module that needs a missing package
            obj = None
        if obj is not None:
            return obj
    return None


def build_catalog() -> dict[str, Any]:
    import transformers
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    mappings = [n for n in dir(modeling_auto) if n.startswith("MODEL") and n.endswith("_MAPPING_NAMES")]
    mappings.sort(key=lambda n: (n != "MODEL_MAPPING_NAMES", n))
    config_classes: dict[str, Any] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        try:
            config_classes[model_type] = CONFIG_MAPPING[model_type]
        except Exception:  # noqa: BLE001 - recorded below
            config_classes[model_type] = None
    type_of_class = {}
    for model_type, cls in config_classes.items():
        if cls is not None:
            type_of_class.setdefault(cls, model_type)
    parents: dict[str, list[str]] = {}
    for model_type, cls in config_classes.items():
        for sub in (getattr(cls, "sub_configs", None) or {}).values():
            if isinstance(sub, type) and sub in type_of_class and type_of_class[sub] != model_type:
                parents.setdefault(type_of_class[sub], []).append(model_type)

    types: dict[str, Any] = {}
    for model_type in CONFIG_MAPPING_NAMES:
        cls = config_classes[model_type]
        record: dict[str, Any] = {"config_class": getattr(cls, "__name__", None),
                                  "module": getattr(cls, "__module__", "").rsplit(".", 1)[0],
                                  "subconfig": model_type in parents, "parents": sorted(parents.get(model_type, [])),
                                  "tasks": {}}
        seen: set[str] = set()
        for mapping in mappings:
            name = getattr(modeling_auto, mapping).get(model_type)
            if isinstance(name, (list, tuple)):
                name = name[0]
            if name and name not in seen:
                seen.add(name)
                record["tasks"][task_of(mapping)] = name
        if not record["tasks"] and cls is not None:
            record["tasks"] = _classes_by_config(record["module"], cls)
        if "base" in record["tasks"] and not any(t != "base" for t in record["tasks"]):
            pass
        primary = next((t for t in TASK_PRIORITY if t in record["tasks"]), next(iter(record["tasks"]), None))
        record["primary"] = primary
        record["inputs"], record["attn"], record["main_input"] = {}, {}, {}
        for task, class_name in record["tasks"].items():
            model_cls = model_class(record["module"], class_name)
            if model_cls is None:
                record["inputs"][task] = []
                continue
            try:
                params = list(inspect.signature(model_cls.forward).parameters)
            except ImportError as exc:  # a placeholder class for a missing backend (torchaudio ...)
                record.setdefault("unavailable", {})[task] = " ".join(str(exc).split())
                record["inputs"][task] = []
                continue
            except (TypeError, ValueError):
                params = []
            record["inputs"][task] = [p for p in params if p != "self" and p not in ("kwargs", "args")]
            impls = ["default", "eager"]
            if getattr(model_cls, "_supports_sdpa", False) is True:
                impls.append("sdpa")
            if getattr(model_cls, "_supports_flex_attn", False) is True:
                impls.append("flex")
            record["attn"][task] = impls
            record["main_input"][task] = getattr(model_cls, "main_input_name", "input_ids")
        record["modality"] = {t: modality_of(i, t) for t, i in record["inputs"].items()}
        try:
            defaults = cls().to_dict() if cls is not None else {}
        except Exception:  # noqa: BLE001 - configs that need arguments
            defaults = {}
        record["moe"] = _has_experts(defaults)
        sub_modules = {getattr(CONFIG_MAPPING[t], "__module__", "").rsplit(".", 1)[0]
                       for t in _nested_types(defaults) if t in CONFIG_MAPPING_NAMES}
        record["mrope"] = any(_source_mentions(m, "mrope_section") for m in {record["module"], *sub_modules})
        types[model_type] = record
    return {"version": transformers.__version__, "types": types}


def _nested_types(d: Any) -> set[str]:
    """The model types of the sub-config dicts nested in a config dict."""
    found: set[str] = set()
    if isinstance(d, dict):
        for v in d.values():
            if isinstance(v, dict):
                if isinstance(v.get("model_type"), str):
                    found.add(v["model_type"])
                found |= _nested_types(v)
    return found


def _source_mentions(module: str, text: str) -> bool:
    """Whether the family's modeling source mentions ``text`` (M-RoPE models default a section in code)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        for path in Path(folder).glob("modeling_*.py"):
            if text in path.read_text(errors="ignore"):
                return True
    return False


def _has_experts(d: Any) -> bool:
    if isinstance(d, dict):
        for k, v in d.items():
            if ("expert" in str(k) and isinstance(v, int) and not isinstance(v, bool) and v > 1) or _has_experts(v):
                return True
    return False


def _classes_by_config(module: str, config_cls: type) -> dict[str, str]:
    """Model classes of the config's modeling module(s) whose ``config_class`` is ``config_cls``."""
    try:
        pkg = importlib.import_module(module)
    except Exception:  # noqa: BLE001
        return {}
    found: dict[str, str] = {}
    names = [n for n in dir(pkg) if n[0].isupper()]
    for name in names:
        try:
            obj = getattr(pkg, name)
        except Exception:  # noqa: BLE001 - a lazy attribute whose import fails
            continue
        try:
            match = isinstance(obj, type) and getattr(obj, "config_class", None) is config_cls and hasattr(obj, "forward")
        except ImportError:  # a placeholder class for a missing backend
            continue
        if match and "PreTrained" not in name:
            found.setdefault(_guess_task(name), name)
    return dict(sorted(found.items(), key=lambda kv: (kv[0] != "base", kv[0])))


def _guess_task(class_name: str) -> str:
    for suffix, task in (("ForCausalLM", "causal_lm"), ("ForConditionalGeneration", "conditional_generation"),
                         ("ForMaskedLM", "masked_lm"), ("ForSequenceClassification", "sequence_classification"),
                         ("ForImageClassification", "image_classification")):
        if class_name.endswith(suffix):
            return task
    return "base" if class_name.endswith("Model") else class_name.lower()


def load_catalog() -> dict[str, Any]:
    """The shipped catalog for the installed transformers, rebuilt live (slow) when stale."""
    return load_shipped(DATA, "transformers", empty={"version": None, "types": {}},
                        stale=lambda version: build_catalog())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA)
    args = parser.parse_args(argv)
    catalog = build_catalog()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(catalog, indent=1))
    n = len(catalog["types"])
    print(f"{n} config types, {sum(len(t['tasks']) for t in catalog['types'].values())} model classes, "
          f"{sum(t['subconfig'] for t in catalog['types'].values())} sub-configs -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
