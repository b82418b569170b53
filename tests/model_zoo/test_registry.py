"""Registry semantics: decorator registration, strict names, wildcard selection, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

from model_zoo import registry
from model_zoo.errors import DuplicateModelError, ModelBuildError, UnknownModelError
from model_zoo.registry import ModelEntry, Registry


def _builder(config, entry):  # noqa: ANN001 - never called
    raise AssertionError


def test_decorator_registers_and_duplicate_is_an_error():
    reg = Registry()

    @reg.register_model("toy/a", modality="text")
    def build_a(config, entry):  # noqa: ANN001
        return None

    assert reg.names() == ["toy/a"]
    assert reg.get_entry("toy/a").builder is build_a
    with pytest.raises(DuplicateModelError, match="toy/a"):
        reg.register_model("toy/a", modality="text")(build_a)


def test_family_loader_runs_once_on_first_read_and_duplicates_across_families_fail():
    reg = Registry()
    calls = []

    @reg.register_family("toy")
    def entries():
        calls.append(1)
        yield ModelEntry(name="toy/x", modality="image", builder=_builder)
        yield ModelEntry(name="toy/y", modality="image", builder=_builder)

    assert calls == []
    assert reg.list_models() == ["toy/x", "toy/y"]
    assert reg.list_models() == ["toy/x", "toy/y"]
    assert calls == [1]
    with pytest.raises(DuplicateModelError):
        reg.add(ModelEntry(name="toy/x", modality="image", builder=_builder))


def test_wildcards_with_exclusions_and_primary_only():
    reg = Registry()
    for name in ("hf/gpt2", "hf/bert", "timm/resnet18", "timm/resnet50", "timm/vit_tiny"):
        reg.add(ModelEntry(name=name, modality="x", builder=_builder))
    reg.add(ModelEntry(name="hf/gpt2:causal_lm", modality="text", builder=_builder, variant_of="hf/gpt2"))
    assert reg.list_models("timm/resnet*") == ["timm/resnet18", "timm/resnet50"]
    assert reg.list_models(["timm/*", "hf/bert"], exclude=["*50", "*vit*"]) == ["hf/bert", "timm/resnet18"]
    assert reg.list_models("hf/gpt2*") == ["hf/gpt2", "hf/gpt2:causal_lm"]
    assert reg.list_models("hf/gpt2*", primary_only=True) == ["hf/gpt2"]
    assert reg.get_entry("hf/gpt2:causal_lm").architecture == "hf/gpt2"


def test_unknown_name_lists_close_matches():
    with pytest.raises(UnknownModelError) as info:
        registry.get_entry("timm/resnet19")
    message = str(info.value)
    assert "unknown model 'timm/resnet19'" in message and "timm/resnet18" in message
    assert "\n" not in message
    assert isinstance(info.value, ModelBuildError)  # build() callers catch one type


def test_entry_names_are_family_slash_arch_and_families_are_all_present():
    names = registry.list_models()
    assert len(names) > 2000
    assert all("/" in n for n in names)
    assert set(registry.families()) >= {"timm", "hf", "diffusion", "world", "molecule", "robotics", "flex"}
    for name in ("timm/resnet18", "hf/gpt2", "hf/gpt2:causal_lm", "hf/mamba", "hf/wav2vec2", "hf/whisper",
                 "hf/patchtst", "hf/llava", "diffusion/unet2d_condition", "diffusion/dit", "diffusion/vae_kl"):
        assert name in names


def test_entries_record_their_axes():
    entry = registry.get_entry("hf/gpt2:causal_lm")
    assert entry.family == "hf" and entry.tasks == ("causal_lm",)
    assert "sdpa" in entry.attn and set(entry.knob_values) >= {"layers", "hidden", "heads"}
    moe = registry.get_entry("hf/mixtral")
    assert "experts" in moe.knob_values
    flex = registry.get_entry("flex/causal_lm")
    assert flex.unsupported_reason({"attn": "flex", "mode": "train"})
    assert flex.unsupported_reason({"attn": "sdpa", "mode": "train"}) is None


def test_import_and_listing_import_no_model_package():
    code = ("import sys, model_zoo; n = len(model_zoo.list_models()); "
            "print(n, [m for m in ('timm', 'transformers', 'diffusers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(None, 1)
    assert int(out[0]) > 2000
    assert out[1].strip() == "[]"


def test_a_renamed_architecture_answers_to_its_old_name():
    from model_zoo.config import ModelConfig

    reg = Registry()
    reg.add(ModelEntry(name="toy/new", modality="text", builder=_builder, sizes=(8,)))
    reg.add(ModelEntry(name="toy/new:lm", modality="text", builder=_builder, variant_of="toy/new"))
    reg.register_alias("toy/old", "toy/new")
    assert reg.get_entry("toy/old").name == "toy/new"
    assert reg.get_entry("toy/old:lm").name == "toy/new:lm", "task variants follow their architecture"
    assert "toy/old" in reg and reg.list_models() == ["toy/new", "toy/new:lm"], "an alias is never listed"
    assert reg.resolve(ModelConfig(arch="toy/old")) == ModelConfig(arch="toy/new", batch=2, size=8)
    with pytest.raises(UnknownModelError, match="toy/newer"):
        reg.get_entry("toy/newer")


def test_aliases_are_strict():
    reg = Registry()
    reg.add(ModelEntry(name="toy/a", modality="text", builder=_builder))
    reg.register_alias("toy/old", "toy/a")
    with pytest.raises(DuplicateModelError, match="already registered"):
        reg.register_alias("toy/old", "toy/b")
    with pytest.raises(DuplicateModelError, match="shadow"):
        reg.register_alias("toy/a", "toy/b")
    with pytest.raises(DuplicateModelError, match="alias"):
        reg.add(ModelEntry(name="toy/old", modality="text", builder=_builder))
    reg.register_alias("toy/x", "toy/y")
    reg.register_alias("toy/y", "toy/x")
    with pytest.raises(ValueError, match="circle"):
        reg.get_entry("toy/x")
