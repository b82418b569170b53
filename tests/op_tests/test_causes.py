"""A failure group is named after the fact that separates its failing samples from its passing ones.

Index ops' samples carry facts about their indices (duplicate, negative, at
the boundary). A backend module (tests/fixtures/accelerator_bugs.py) makes
index_add drop all but the last of repeated indices; the layouts strategy's
failing samples are also strided, as are most passing ones, so the cause must
be the duplicates, not the strides.
"""

from __future__ import annotations

import pytest
import torch

from conformance.outcome import Status
from conformance.settings import RunSettings
from op_tests.causes import case_cause, sample_facts
from op_tests.strategies.templates import make_sample
from op_tests.sources import OpSelection, strategy_cases, op_cases
from results.store import ResultStore
from runner.reporters import StoreWriter
from runner.suite import run_suite
from tests.conftest import built_once


def _facts(op: str, inp, *args) -> frozenset[str]:
    return sample_facts(make_sample((inp, args, {}), "sample"), op=op)


def test_index_facts_read_the_index_arguments_of_index_ops():
    x = torch.zeros(5, 3)
    assert "duplicate_indices" in _facts("index_add", x, 0, torch.tensor([1, 3, 1]), torch.ones(3, 3))
    assert "duplicate_indices" not in _facts("index_add", x, 0, torch.tensor([1, 3, 2]), torch.ones(3, 3))
    assert "boundary_indices" in _facts("index_select", x, 0, torch.tensor([0, 4]))
    assert "negative_indices" in _facts("take", x, torch.tensor([-15, 2]))
    assert "boundary_indices" in _facts("take", x, torch.tensor([-15, 2]))  # -size: the first element
    # scatter: a repeat within one line along dim writes one place twice; across lines it does not
    assert "duplicate_indices" in _facts("scatter_add", x, 0, torch.tensor([[1, 2], [1, 0]]), torch.ones(2, 2))
    assert "duplicate_indices" not in _facts("scatter_add", x, 0, torch.tensor([[1, 1], [2, 2]]), torch.ones(2, 2))
    # an integer operand of another op is no index
    assert not {f for f in _facts("add", torch.tensor([1, 1]), torch.tensor([1, 1])) if f.endswith("_indices")}


def test_a_fact_most_passing_samples_share_is_no_cause():
    strided, duplicates = frozenset({"noncontiguous"}), frozenset({"noncontiguous", "duplicate_indices"})
    facts = [duplicates, duplicates, strided, strided, strided, frozenset()]
    assert case_cause(facts, [True, True, False, False, False, False]).key == "duplicate_indices"
    # without the separating fact, strides (shared by 3 of 4 passing samples) name nothing
    assert case_cause([strided] * 5 + [frozenset()], [True, True, False, False, False, False]).key == "some"


def _outcomes(results):
    selection = OpSelection(patterns=("index_add",), dtypes=("float32",), directions=("forward",),
                            strategies=("layouts",))
    settings = RunSettings(target="neuron", timeout_s=300, artifacts_dir=str(results / "artifacts"),
                           backend_modules=("tests.fixtures.accelerator_bugs",),
                           env={"ACCEL_BUGS": "index_add_duplicates", "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
    with ResultStore.open(results) as store:
        run_suite(op_cases(selection) + strategy_cases(selection), settings=settings, plugins=[StoreWriter(store)],
                  build_id="dups", manifest={}, target_label="neuron", jobs=2)
        return {r.case.config.get("inputs", r.case.config["source"]): r.outcome for r in store.results("dups")}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return built_once(tmp_path_factory, "index_add_dups", _outcomes)


@pytest.mark.parametrize("source", ["opinfo", "layouts"])
def test_an_index_add_bug_with_duplicate_indices_is_named_after_them(outcomes, source):
    outcome = outcomes[source]
    assert outcome.status is Status.MISMATCH, outcome.message
    cause = outcome.evidence["cause"]
    assert cause["key"] == "duplicate_indices" and cause["text"] == "duplicate indices", cause
