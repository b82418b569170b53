"""PyTorch's documented contracts on ties decide how index outputs are compared, and the ties strategy tests them.

argmax, argmin and max/min(dim) promise the first of tied elements, sort with
stable=True the input's order; topk, median and the others allow any. A
backend module (tests/fixtures/accelerator_bugs.py) makes argmax return the
last tie: the suite must catch it with a mismatch from the comparison alone,
while the clean emulated device passes every tie case.
"""

from __future__ import annotations

import pytest
import torch

from conformance.outcome import Status
from op_tests.strategies import strategy_samples
from op_tests.rules import gather_index_output, rule_for, tie_contract
from op_tests.sources import OpSelection, strategy_cases, get_op, op_cases
from tests.conftest import built_once
from tests.op_tests.suite_runs import run_cases

PROMISED = ("argmax", "argmin", "max.reduction_with_dim", "min.reduction_with_dim")
ANY = ("topk", "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin", "sort", "argsort")


def test_indices_are_compared_exactly_where_the_docs_promise_one():
    for key in PROMISED:
        rule = rule_for(key)
        assert tie_contract(key) == "one" and rule.gather is None, key
        assert "the first" in rule.reason and rule.reason.startswith("torch."), rule.reason
    for key in ANY:
        rule = rule_for(key)
        assert tie_contract(key) == "any" and rule.gather is not None, key
        assert rule.reason.startswith("torch.") and "'" in rule.reason, rule.reason  # quotes the docs
    assert tie_contract("softmax") is None


def test_stable_sort_keeps_its_indices_and_an_unstable_one_is_judged_by_the_values_they_select():
    spec = rule_for("sort").gather
    x = torch.tensor([1.0, 0.0, 1.0, 0.0])
    stable = torch.sort(x, stable=True)
    assert gather_index_output(spec, x, (), {"stable": True}, stable) is stable
    values, selected = gather_index_output(spec, x, (), {}, torch.sort(x))
    assert torch.equal(selected, values)


def test_the_ties_strategy_gives_tied_samples_to_ops_with_a_tie_contract():
    cases = strategy_cases(OpSelection(patterns=(*PROMISED, *ANY, "softmax"), strategies=("ties",)))
    names = {c.name for c in cases}
    assert {"argmax", "argmin", "max", "min", "sort", "topk", "median", "cummax"} <= names
    assert "softmax" not in names and "mode" not in names  # no tie contract; mode's value itself may differ
    assert {(c.name, c.dtype) for c in cases if c.mode == "backward"} == {("max", "float32"), ("min", "float32")}
    argmax = next(c for c in cases if c.name == "argmax" and c.dtype == "float32")
    samples = strategy_samples(get_op("argmax"), argmax)
    tied_rows = [s for s in samples if "few distinct" in s.name
                 and bool((s.input == s.input.amax(dim=-1, keepdim=True)).sum(-1).gt(1).any())]
    assert tied_rows, [s.name for s in samples]
    assert any("stable" in s.kwargs for s in strategy_samples(get_op("sort"), next(c for c in cases if c.name == "sort")))


def _run(results, cases, build: str, env: dict, backend_modules=()):
    ran = run_cases(results, cases, build, {**env, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}, backend_modules)
    return {(c.name, c.dtype, c.mode, c.config.get("inputs", c.config["source"])): o for c, o in ran}


def _outcomes(results):
    ties = OpSelection(patterns=(*PROMISED, *ANY), strategies=("ties",))
    clean = _run(results, strategy_cases(ties), "clean", {})
    argmax = OpSelection(patterns=("argmax", "argmin"), dtypes=("float32", "int64"), directions=("forward",),
                         strategies=("ties",))
    buggy = _run(results, op_cases(argmax) + strategy_cases(argmax), "last_tie", {"ACCEL_BUGS": "argmax_last_tie"},
                 backend_modules=("tests.fixtures.accelerator_bugs",))
    return clean, buggy


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return built_once(tmp_path_factory, "ties", _outcomes)


def test_the_clean_device_passes_every_tie_case(outcomes):
    clean, _ = outcomes
    assert len(clean) >= 20
    bad = {k: (o.status.value, o.message[:200]) for k, o in clean.items() if o.status is not Status.PASS}
    assert not bad, bad


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_argmax_returning_the_last_tie_is_a_mismatch(outcomes, dtype):
    _, buggy = outcomes
    outcome = buggy[("argmax", dtype, "forward", "ties")]
    assert outcome.status is Status.MISMATCH, outcome.message
    assert buggy[("argmin", dtype, "forward", "ties")].status is Status.PASS, "argmin's kernel is untouched"
