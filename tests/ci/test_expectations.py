"""Expectations files: known failures with a reason and an issue link, matched by globs or id."""

from __future__ import annotations

import pytest

from ci.expectations import ExpectationsError, load_expectations
from tests.conftest import run_cli
from tests.results.rows import model, op

GOOD = """
backend = "neuron"

[[failure]]
name = "nn.functional.*"
dtype = "bfloat16"
reason = "Scalar Engine approximation"
issue = "https://github.com/aws-neuron/aws-neuron-sdk/issues/1323"

[[failure]]
id = "%s"
reason = "known crash"
issue = "https://github.com/aws-neuron/aws-neuron-sdk/issues/827"

[[failure]]
kind = "model"
category = "timm"
mode = "steps*"
reason = "bf16 fine-tuning collapse"
issue = "https://github.com/aws-neuron/aws-neuron-sdk/issues/667"
"""


def test_globs_and_ids_match(tmp_path):
    sort = op("sort")
    path = tmp_path / "neuron.toml"
    path.write_text(GOOD % sort.id)
    exp = load_expectations(path)
    assert exp.match(op("nn.functional.gelu", dtype="bfloat16")).index == 1
    assert exp.match(op("nn.functional.gelu", dtype="float32")) is None
    assert exp.match(sort).reason == "known crash"
    assert exp.match(op("sort", dtype="float64")) is None, "an id names one case only"
    assert exp.match(model("timm", "resnet18", "steps5")).index == 3
    assert exp.match(model("timm", "resnet18", "eval")) is None
    exp.check_backend("neuron:compile")
    with pytest.raises(ExpectationsError, match="cannot judge a build of target 'cuda'"):
        exp.check_backend("cuda")


def test_family_is_still_read_as_category(tmp_path):
    """Files written when the selector was called family keep working; giving both is refused."""
    path = tmp_path / "old.toml"
    path.write_text('[[failure]]\nfamily = "timm"\nreason = "r"\nissue = "https://x/1"\n')
    exp = load_expectations(path)
    assert exp.match(model("timm", "resnet18", "eval")).category == "timm"
    assert exp.match(model("hf", "gpt2", "eval")) is None
    path.write_text('[[failure]]\nfamily = "timm"\ncategory = "hf"\nreason = "r"\nissue = "https://x/1"\n')
    with pytest.raises(ExpectationsError, match="not both category and its old name family"):
        load_expectations(path)


@pytest.mark.parametrize("body, message", [
    ('[[failure]]\nname = "tanh"\nissue = "https://x/1"\n', "failure 1: missing 'reason'"),
    ('[[failure]]\nname = "tanh"\nreason = "r"\nissue = "#12"\n', "expected a link"),
    ('[[failure]]\nnmae = "tanh"\nreason = "r"\nissue = "https://x/1"\n', "unknown key 'nmae'; did you mean 'name'"),
    ('[[failure]]\nreason = "r"\nissue = "https://x/1"\n', "selects nothing"),
    ('[[failure]]\nid = "ab"\nname = "x"\nreason = "r"\nissue = "https://x/1"\n', "either id or field globs"),
    ('[[failure]]\nname = 3\nreason = "r"\nissue = "https://x/1"\n', "name=3 (type=int)"),
    ('failures = []\n', "unknown key 'failures'; did you mean 'failure'"),
    ('[[failure]\n', "not valid TOML"),
])
def test_bad_files_say_where_and_why(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ExpectationsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_expectations(path)


def test_bad_file_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[[failure]]\nname = "tanh"\nissue = "https://x/1"\n')
    r = run_cli("neuron-conformance", "gate", "--results", str(tmp_path), "--build", "a", "--baseline", "b",
                "--expectations", str(path))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "missing 'reason'" in r.stderr, r.stderr
    r = run_cli("neuron-conformance", "gate", "--results", str(tmp_path), "--build", "a", "--baseline", "b",
                "--expectations", str(tmp_path / "absent.toml"))
    assert r.returncode == 2 and "No such file" in r.stderr and "Traceback" not in r.stderr, r.stderr
