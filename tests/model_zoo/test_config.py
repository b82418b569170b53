"""ModelConfig: validation, round trips and ids that are stable across processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from model_zoo import ModelConfig, default_config
from model_zoo.execute import model_case

CONFIGS = [
    ModelConfig(arch="timm/resnet18", batch=2, size=32),
    ModelConfig(arch="hf/gpt2:causal_lm", dtype="bfloat16", batch=1, size=16, mode="steps", steps=3, attn="sdpa",
                layers=4),
    ModelConfig(arch="hf/mixtral", experts=8, execution="compile", mode="eval", seed=7),
]


def test_round_trip_and_ids_tell_configs_apart():
    for cfg in CONFIGS:
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
        assert ModelConfig.from_dict(cfg.set_fields()) == cfg  # what a model case stores is enough to rebuild it
        assert re.fullmatch("[0-9a-f]{16}", cfg.config_id)
    assert len({c.config_id for c in CONFIGS}) == len(CONFIGS)
    for field, value in (("dtype", "float16"), ("seed", 1), ("hidden", 32), ("execution", "compile")):
        assert CONFIGS[0].replace(**{field: value}).config_id != CONFIGS[0].config_id, field


def test_ids_hash_only_the_fields_set():
    """A new axis with a default must not rename every stored model case (the gate would call them all missing)."""

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Wider(ModelConfig):
        new_axis: str = "off"

    for cfg in CONFIGS:
        wide = Wider(**cfg.to_dict())
        assert wide.config_id == cfg.config_id
        assert model_case(wide).id == model_case(cfg).id
        assert model_case(cfg).config == cfg.set_fields()
    assert Wider(**CONFIGS[0].to_dict(), new_axis="on").config_id != CONFIGS[0].config_id
    assert ModelConfig(arch="timm/resnet18", layers=None, seed=0).set_fields() == {"arch": "timm/resnet18"}


def test_ids_are_stable_across_processes():
    code = ("import json, sys; from model_zoo import ModelConfig; "
            "print(json.dumps([ModelConfig.from_dict(d).config_id for d in json.loads(sys.argv[1])]))")
    payload = json.dumps([c.to_dict() for c in CONFIGS])
    out = subprocess.run([sys.executable, "-c", code, payload], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout
    assert json.loads(out) == [c.config_id for c in CONFIGS]


@pytest.mark.parametrize("bad", [
    {"arch": "resnet18"}, {"arch": "timm/x", "dtype": "float64"}, {"arch": "timm/x", "mode": "steps"},
    {"arch": "timm/x", "mode": "train", "steps": 3}, {"arch": "timm/x", "batch": -1}, {"arch": "timm/x", "layers": 0},
    {"arch": "timm/x", "attn": "flash"}, {"arch": "timm/x", "execution": "jit"},
])
def test_invalid_values_are_refused_with_name_value_type(bad):
    with pytest.raises(ValueError, match=r"=.*\(type="):
        ModelConfig(**bad)


def test_from_dict_refuses_unknown_fields():
    with pytest.raises(ValueError, match="unknown fields"):
        ModelConfig.from_dict({"arch": "timm/x", "colour": "red"})


def test_default_config_fills_entry_defaults():
    cfg = default_config("timm/resnet18")
    assert cfg.batch >= 1 and cfg.size >= 16 and cfg.dtype == "float32" and cfg.mode == "train"
