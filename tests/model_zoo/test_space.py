"""The configuration space: size, counting, enumeration, exclusions and stratified sampling."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time

from model_zoo import count_configs, enumerate_configs, get_entry, list_models, load_status, sample_configs
from model_zoo.status import is_buildable


def test_space_holds_over_100k_configs_and_counts_fast():
    start = time.perf_counter()
    counts = count_configs()
    assert time.perf_counter() - start < 20
    assert counts["total"] >= 100_000
    assert set(counts["families"]) >= {"timm", "hf", "diffusion", "world", "molecule", "robotics", "flex"}
    assert counts["families"]["timm"]["total"] >= 1371
    for axis in ("dtype", "batch", "size", "mode", "execution", "attn", "knobs"):
        assert sum(counts["axes"][axis].values()) == counts["total"]
    assert set(counts["axes"]["dtype"]) == {"float32", "bfloat16", "float16"}
    assert set(counts["axes"]["mode"]) == {"eval", "train", "steps"}


def test_counts_match_enumeration_including_exclusions():
    patterns = ["flex/*", "hf/llama*", "timm/resnet1*", "diffusion/dit"]
    configs = list(enumerate_configs(patterns=patterns))
    counts = count_configs(patterns=patterns)
    assert counts["total"] == len(configs) == len({c.config_id for c in configs})
    assert counts["axes"]["attn"].get("flex", 0) == sum(c.attn == "flex" for c in configs)
    for cfg in configs:
        entry = get_entry(cfg.arch)
        assert entry.unsupported_reason(cfg.to_dict()) is None
        entry.check(cfg)


def test_enumeration_is_lazy():
    start = time.perf_counter()
    first = list(itertools.islice(enumerate_configs(), 1000))
    assert len(first) == 1000 and time.perf_counter() - start < 10


def test_sample_is_deterministic_and_covers_every_buildable_architecture():
    families = ["flex", "world", "molecule", "robotics", "diffusion"]
    status = {name: {"status": "ok"} for name in list_models([f"{f}/*" for f in families])}
    status["diffusion/dit"] = {"status": "error", "reason": "pretend it failed"}
    a = sample_configs(120, seed=3, families=families, status=status)
    b = sample_configs(120, seed=3, families=families, status=status)
    assert [c.config_id for c in a] == [c.config_id for c in b]
    assert len(a) == 120 and len({c.config_id for c in a}) == 120
    archs = {c.arch for c in a}
    assert archs >= {n for n in status if is_buildable(n, status)}
    assert "diffusion/dit" not in archs
    assert {c.dtype for c in a} == {"float32", "bfloat16", "float16"}
    assert {c.mode for c in a} == {"eval", "train", "steps"}
    assert sample_configs(120, seed=4, families=families, status=status) != a


def test_sample_respects_where_and_is_stable_across_processes():
    where = {"execution": ["eager"], "dtype": ["float32", "bfloat16"]}
    configs = sample_configs(300, seed=0, patterns=["timm/resnet*", "hf/bert*", "flex/*"], where=where)
    assert {c.execution for c in configs} == {"eager"} and {c.dtype for c in configs} <= {"float32", "bfloat16"}
    code = ("import json; from model_zoo import sample_configs; print(json.dumps([c.config_id for c in sample_configs("
            "300, seed=0, patterns=['timm/resnet*', 'hf/bert*', 'flex/*'], "
            "where={'execution': ['eager'], 'dtype': ['float32', 'bfloat16']})]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [c.config_id for c in configs]


def test_full_ci_sample_covers_the_shipped_status():
    status = load_status()
    configs = sample_configs(2000, seed=0)
    assert len(configs) >= 2000
    covered = {get_entry(c.arch).architecture for c in configs}
    buildable = {get_entry(n).architecture for n in list_models() if is_buildable(n, status)}
    assert buildable <= covered
