"""Model cases: faults injected into the device are found in the models that use
the faulty op and not in the others; clean runs pass under ``exact``."""

from __future__ import annotations

import pytest

from model_zoo.execute import model_case
from conformance.outcome import Status
from conformance.settings import RunSettings
from runner.reporters import StoreWriter
from runner.suite import run_suite
from results.store import ResultStore

ARCHS = ("hf/bert", "hf/gpt2:causal_lm", "timm/legacy_seresnet18")
PERTURBED, SILENT_FALLBACK = "aten::gelu", "aten::native_layer_norm"


def _run(tmp_path, build, faults=""):
    from model_zoo import default_config

    cases = [model_case(default_config(arch, mode="train")) for arch in ARCHS]
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": faults}
    settings = RunSettings(target="neuron", timeout_s=600, artifacts_dir=str(tmp_path / "artifacts"), env=env)
    with ResultStore.open(tmp_path) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id=build, manifest={}, target_label="neuron", jobs=2)
        return {row.case.name: row.outcome for row in store.results(build)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    clean = _run(path, "clean")
    faulty = _run(path, "faulty", f"perturb@{PERTURBED},rel=0.01;host_fallback@{SILENT_FALLBACK}")
    return clean, faulty


def test_clean_models_pass_under_exact(runs):
    clean, _ = runs
    for arch, outcome in clean.items():
        assert outcome.status is Status.PASS, (arch, outcome.message)
        assert outcome.evidence["compared"] > 3, "outputs, loss and gradients are all compared"


def test_faults_are_found_exactly_where_the_ops_are_used(runs):
    clean, faulty = runs
    for arch in ARCHS:
        used = set(clean[arch].evidence["executed_ops"])
        uses_perturbed = any(op.split(".")[0] == PERTURBED for op in used)
        uses_fallback = any(op.split(".")[0] == SILENT_FALLBACK for op in used)
        outcome = faulty[arch]
        if uses_perturbed:
            assert outcome.status is Status.MISMATCH, (arch, outcome.message)
        elif uses_fallback:
            assert outcome.status is Status.CPU_FALLBACK, (arch, outcome.message)
            assert SILENT_FALLBACK in outcome.evidence["fallback_ops"]
        else:
            assert outcome.status is Status.PASS, (arch, outcome.message)
    # the selection covers all three situations
    kinds = {faulty[a].status for a in ARCHS}
    assert kinds == {Status.MISMATCH, Status.CPU_FALLBACK, Status.PASS}
