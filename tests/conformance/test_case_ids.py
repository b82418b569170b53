"""Case ids are what results, baselines, shards and the reference cache are keyed by: they may not drift.

Each id below was printed once and pinned. A change that moves one renames that
case in every stored build (the gate then calls its baseline result missing),
so a failure here means: keep the old id, or say in the change why every
stored result of that kind must be re-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.paths import DISPLAY_ROOT_ENV

ROOT = Path(__file__).resolve().parents[2]


def op_cases():
    from op_tests.sources import OpSelection, all_cases

    selection = OpSelection(patterns=("add",), dtypes=("float32",), directions=("forward",), hypothesis_examples=16,
                            strategies=("extremes",))
    return {c.config["source"]: c for c in all_cases(selection)}


def test_op_case_ids():
    assert {source: c.id for source, c in op_cases().items()} == {
        "opinfo": "d27ca85923254a28", "hypothesis": "0cd00f1a00f517b6", "family": "cc611326bc40adb7",
    }


def test_model_case_ids():
    from model_zoo import ModelConfig
    from model_zoo.execute import model_case

    resnet = ModelConfig(arch="timm/resnet18", batch=2, size=32)
    gpt2 = ModelConfig(arch="hf/gpt2:causal_lm", dtype="bfloat16", batch=1, size=16, mode="steps", steps=3, layers=2)
    assert [model_case(resnet).id, model_case(gpt2).id] == ["1bca12bf05e7170a", "db1da6bf24cc7e3f"]
    assert [resnet.config_id, gpt2.config_id] == ["64d5084f6b66db8d", "e041a64d41fffb84"]


def test_script_case_id(monkeypatch):
    from validate.run import ValidateOptions, script_case
    from validate.script import ScriptInfo

    monkeypatch.setenv(DISPLAY_ROOT_ENV, str(ROOT))  # the id holds the script's path as the user sees it
    script = ScriptInfo(path=str(ROOT / "examples" / "tiny_gpt.py"), convention="training", model_name=None,
                        inputs_name=None, has_loss_fn=False, has_optimizer=True, device_option="--device",
                        calls_backward=True)
    case = script_case(ValidateOptions(script=script, target="", mode="compile", steps=5, steps_given=True, seed=1))
    assert case.name == "examples/tiny_gpt.py"
    assert case.id == "a9e837367ec16384"


@pytest.mark.parametrize("args, expected", [
    (("collectives", "all_reduce.sum", 2), "0cbe45fc4528842e"),
    (("ddp", "hf/gpt2:causal_lm", 4, 3), "75bde8b0cbd053ca"),
])
def test_distributed_case_ids(args, expected):
    from distributed.execute import distributed_case

    suite, name, world, *steps = args
    assert distributed_case(suite, name, world, steps=steps[0] if steps else 0).id == expected


def test_a_case_dict_written_with_family_reads_as_its_category():
    """Dicts written before ``Case.family`` became ``category`` (JSON lines, reproducers) rebuild the same case."""
    from conformance.case import Case

    case = Case(kind="model", name="timm/resnet18", category="timm", dtype="float32", mode="eval")
    old = {k: v for k, v in case.to_dict().items() if k != "category"} | {"family": "timm"}
    assert Case.from_dict(old) == case and Case.from_dict(old).id == case.id
