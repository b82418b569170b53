"""The operator suite catches real faults injected into the device, with the right outcome.

Detection comes from the comparison and from isolation, never from knowing
the faults: the suite runs unchanged, the faults live in the device.
"""

from __future__ import annotations

import pytest

from conformance.outcome import Status
from conformance.settings import RunSettings
from runner.reporters import StoreWriter
from runner.suite import run_suite
from op_tests.sources import OpSelection, op_cases
from results.store import ResultStore
from tests.conftest import built_once

FP32_RTOL = 1.3e-6
FAULTS = ";".join([
    f"perturb@aten::tanh,rel={10 * FP32_RTOL}",           # forward, 10x the tolerance
    f"perturb@aten::sigmoid_backward,rel={10 * FP32_RTOL}",  # backward only
    "wrong_dtype@aten::abs",
    "wrong_shape@aten::neg",
    "raise@aten::cumsum",
    "host_fallback@aten::sin",
    "host_output@aten::exp2",
    "crash@aten::cos",
])


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return built_once(tmp_path_factory, "faults", _outcomes)


def _outcomes(results):
    cases = op_cases(OpSelection(
        patterns=("tanh", "sigmoid", "abs", "neg", "cumsum", "sin", "exp2", "cos", "add"),
        dtypes=("float32",), max_samples=6,
    ))
    settings = RunSettings(
        target="neuron", timeout_s=300, artifacts_dir=str(results / "artifacts"),
        env={"NEURON_VALIDATE_FAULTS": FAULTS, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"},
    )
    with ResultStore.open(results) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id="faulty", manifest={}, target_label="neuron", jobs=2)
        return {(row.case.name, row.case.mode): row.outcome for row in store.results("faulty")}


@pytest.mark.parametrize("op, mode, status, needle", [
    ("tanh", "forward", Status.MISMATCH, "Mismatched elements"),
    ("sigmoid", "backward", Status.MISMATCH, "Mismatched elements"),
    ("abs", "forward", Status.MISMATCH, "dtype torch.float64 != torch.float32"),
    ("neg", "forward", Status.MISMATCH, "shape"),
    ("cumsum", "forward", Status.ERROR, "injected fault in aten::cumsum"),
    ("sin", "forward", Status.CPU_FALLBACK, "aten::sin"),
    ("exp2", "forward", Status.MISMATCH, "output is on cpu"),
    ("cos", "forward", Status.CRASH, "SIGSEGV"),
])
def test_fault_is_caught(outcomes, op, mode, status, needle):
    outcome = outcomes[(op, mode)]
    assert outcome.status is status, outcome.message
    assert needle in outcome.message


def test_untouched_ops_still_pass(outcomes):
    assert outcomes[("sigmoid", "forward")].status is Status.PASS, "backward-only fault leaves forward alone"
    assert outcomes[("add", "forward")].status is Status.PASS
    assert outcomes[("add", "backward")].status is Status.PASS


def test_failures_have_reproducers(outcomes):
    for key in [("tanh", "forward"), ("cos", "forward")]:
        assert outcomes[key].repro and outcomes[key].repro.endswith("repro.py"), key


def test_a_hang_is_a_timeout_and_the_run_goes_on(tmp_path):
    cases = op_cases(OpSelection(patterns=("exp", "add"), dtypes=("float32",), directions=("forward",), max_samples=3))
    settings = RunSettings(target="neuron", timeout_s=15, artifacts_dir=str(tmp_path / "artifacts"),
                           env={"NEURON_VALIDATE_FAULTS": "hang@aten::exp", "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
    with ResultStore.open(tmp_path) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id="hang", manifest={}, target_label="neuron", jobs=1)
        got = {row.case.name: row.outcome for row in store.results("hang")}
    assert got["exp"].status is Status.TIMEOUT and "timed out" in got["exp"].message
    assert got["exp"].repro, "the replacement worker writes the reproducer"
    assert got["add"].status is Status.PASS


def test_host_execution_the_backend_does_not_report_is_cpu_fallback(tmp_path):
    """A --backend-module kernel copies sin's input to the host, computes there and copies back; the emulated
    device's tracking never hears of it. The execution trace of the op does."""
    import json

    from tests.conftest import REPO, run_cli

    jsonl = tmp_path / "out.jsonl"
    result = run_cli("neuron-conformance", "ops", "--ops", "sin,cos", "--dtypes", "float32", "--max-samples", "4", "--strategies", "none",
                     "--backend-module", "tests.fixtures.host_ops", "--results", str(tmp_path), "--jsonl", str(jsonl),
                     env={"PYTHONPATH": REPO, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
    assert result.returncode in (0, 1), result.stderr[-2000:]
    rows = {(r["case"]["name"], r["case"]["mode"]): r["outcome"] for r in map(json.loads, jsonl.read_text().splitlines())}
    for mode in ("forward", "backward"):
        sin = rows[("sin", mode)]
        assert sin["status"] == Status.CPU_FALLBACK.value, sin["message"]
        assert sin["evidence"]["host_copies"]["aten::sin"] >= 2
        assert "aten::sin" not in sin["evidence"]["fallback_ops"], "the backend's own tracking saw nothing"
    assert rows[("cos", "forward")]["status"] == Status.PASS.value
    assert "aten::sin" in rows[("cos", "backward")]["evidence"]["host_copies"], "cos's gradient is -sin"
    assert "profiler_start" not in result.stderr and "Execution Trace" not in result.stderr


@pytest.mark.parametrize("strict", [True, False])
def test_a_kernel_that_fails_at_execution_raises_when_strict_and_reruns_on_the_host_when_not(tmp_path, strict):
    profile = "exact" if strict else "exact:rerun_failed_kernels_on_host=true"
    cases = op_cases(OpSelection(patterns=("cumsum",), dtypes=("float32",), directions=("forward",), max_samples=3))
    settings = RunSettings(target="neuron", timeout_s=300, artifacts_dir=str(tmp_path / "artifacts"),
                           env={"NEURON_VALIDATE_FAULTS": "raise@aten::cumsum",
                                "NEURON_VALIDATE_EMULATOR_PROFILE": profile})
    with ResultStore.open(tmp_path) as store:
        run_suite(cases, settings=settings, plugins=[StoreWriter(store)], build_id="b", manifest={},
                  target_label="neuron", jobs=1)
        (row,) = store.results("b")
    expected = Status.ERROR if strict else Status.CPU_FALLBACK
    assert row.outcome.status is expected, row.outcome.message
