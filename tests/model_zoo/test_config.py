"""ModelConfig: validation, round trips and ids that are stable across processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model_zoo import ModelConfig, default_config

CONFIGS = [
    ModelConfig(arch="timm/resnet18", batch=2, size=32),
    ModelConfig(arch="hf/gpt2:causal_lm", dtype="bfloat16", batch=1, size=16, mode="steps", steps=3, attn="sdpa",
                layers=4),
    ModelConfig(arch="hf/mixtral", experts=8, execution="compile", mode="eval", seed=7),
]


def test_round_trip_and_id_format():
    for cfg in CONFIGS:
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
        assert len(cfg.config_id) == 16 and int(cfg.config_id, 16) >= 0
    assert len({c.config_id for c in CONFIGS}) == len(CONFIGS)
    assert CONFIGS[0].replace(dtype="float16").config_id != CONFIGS[0].config_id


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
