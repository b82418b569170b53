"""neuron-validate compare: what changed between two runs, e.g. before and after a backend change."""

from __future__ import annotations

import json
import os

from tests.conftest import run_cli
from tests.validate.conftest import example

FAULT = {"NEURON_VALIDATE_FAULTS": "perturb@aten::atan,rel=0.01"}


def _reports(validate):
    old = validate(example("perturbed_block.py"))
    new = validate(example("perturbed_block.py"), env=FAULT)
    return os.path.join(old.out, "report.json"), os.path.join(new.out, "report.json")


def test_a_regression_is_reported_with_its_cause(validate):
    old, new = _reports(validate)
    result = run_cli("neuron-validate", "compare", old, new)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "ready -> not ready" in out
    assert "+ new error numerics" in out and "blocks.2" in out
    assert "first diverging layer: None -> blocks.2" in out
    assert "first diverging op: None -> aten::atan" in out
    assert "NEURON_VALIDATE_FAULTS: None -> perturb@aten::atan,rel=0.01" in out


def test_a_fix_is_reported_as_resolved(validate):
    old, new = _reports(validate)
    result = run_cli("neuron-validate", "compare", os.path.dirname(new), os.path.dirname(old), "--json")
    assert result.returncode == 0, result.stderr
    diff = json.loads(result.stdout)
    assert diff["old_verdict"] == "not ready" and diff["new_verdict"] == "ready" and not diff["worse"]
    assert [f["check"] for f in diff["resolved"]] == ["numerics"]


def test_a_report_against_itself_has_no_changes(validate):
    old = os.path.join(validate(example("perturbed_block.py")).out, "report.json")
    result = run_cli("neuron-validate", "compare", old, old)
    assert result.returncode == 0 and "no changes" in result.stdout
