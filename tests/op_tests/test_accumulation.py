"""Long float16 and bfloat16 rows catch a kernel that accumulates in its own reduced precision.

A backend module (tests/fixtures/accelerator_bugs.py) makes ``mean`` of
float16 and bfloat16 add in its own dtype. OpInfo's rows are too short for
that to show; the ``accumulation`` strategy's rows of 128 to 65,536 elements must
catch it by comparison with the float64 golden, while a device that
accumulates in float32 (the emulated one, under its default Trainium
profile) passes every accumulation case.
"""

from __future__ import annotations

import pytest
import torch

from conformance.outcome import Status
from op_tests.strategies import strategy_samples
from op_tests.strategies.accumulation import accumulating_dims
from op_tests.sources import OpSelection, strategy_cases, get_op, op_cases
from tests.conftest import built_once
from tests.op_tests.suite_runs import run_cases

ACCUMULATING = ("mean", "sum", "cumsum", "softmax", "log_softmax", "var", "nn.functional.layer_norm", "mm", "addmm")


def test_the_dimensions_an_op_sums_over_are_found_by_perturbing_a_rows_ends():
    x = torch.randn(4, 6)
    assert accumulating_dims(get_op("sum"), (x, (1,), {})) == [(0, 1)]
    assert accumulating_dims(get_op("cumsum"), (x, (0,), {})) == [(0, 0)]
    assert accumulating_dims(get_op("exp"), (x, (), {})) == []
    # addmm(input, mat1, mat2): only the contracted K dimension of mat1 and mat2 folds
    assert accumulating_dims(get_op("addmm"), (torch.randn(4, 3), (x, torch.randn(6, 3)), {})) == [(1, 1), (2, 0)]
    names = {c.name for c in strategy_cases(OpSelection(patterns=("mean", "exp", "add", "mm", "addmm", "flip",
                                                                "nn.functional.dropout", "empty_like"),
                                                      strategies=("accumulation",)))}
    assert names == {"mean", "mm", "addmm"}


def test_accumulation_samples_are_long_rows_in_the_cases_dtype():
    case = next(c for c in strategy_cases(OpSelection(patterns=("mm",), strategies=("accumulation",)))
                if c.dtype == "bfloat16")
    samples = strategy_samples(get_op("mm"), case)
    longest = max(s.input.shape[1] for s in samples)
    assert longest == 65536 and all(s.input.dtype == torch.bfloat16 for s in samples)
    assert all(s.input.shape[1] == s.args[0].shape[0] for s in samples), "K is stretched on both operands"


def test_bmm_stretches_k_alone_where_the_batch_has_k_s_length():
    """bmm's template is [10, 5, 10] @ [10, 10, 5]: the batch and K are both 10, so coupling every dimension of
    that length breaks the batch; K is stretched on its own dimension of the other operand."""
    case = next(c for c in strategy_cases(OpSelection(patterns=("bmm",), strategies=("accumulation",)))
                if c.dtype == "float16")
    samples = strategy_samples(get_op("bmm"), case)
    assert {s.input.shape[2] for s in samples} >= {128, 129, 2048, 2049}  # 65,536 is past the element budget
    assert all(s.input.shape[2] == s.args[0].shape[1] and s.input.shape[0] == s.args[0].shape[0] for s in samples)


def _run(results, cases, build: str, env: dict, backend_modules=()):
    ran = run_cases(results, cases, build, env, backend_modules)
    return {(c.name, c.dtype, c.config.get("inputs", c.config["source"])): o for c, o in ran}


def _outcomes(results):
    clean = _run(results, strategy_cases(OpSelection(patterns=ACCUMULATING, strategies=("accumulation",))), "clean", {})
    mean = OpSelection(patterns=("mean",), dtypes=("float16",), directions=("forward",), strategies=("accumulation",))
    buggy = _run(results, op_cases(mean) + strategy_cases(mean), "half_accumulation",
                 {"ACCEL_BUGS": "mean_half_accumulation", "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"},
                 backend_modules=("tests.fixtures.accelerator_bugs",))
    return clean, buggy


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return built_once(tmp_path_factory, "accumulation", _outcomes)


def test_a_device_accumulating_in_float32_passes_every_long_row(outcomes):
    clean, _ = outcomes
    assert len(clean) == 2 * len(ACCUMULATING), sorted(clean)
    bad = {k: (o.status.value, o.message[:200]) for k, o in clean.items() if o.status is not Status.PASS}
    assert not bad, bad


def test_a_float16_mean_accumulated_in_float16_is_a_mismatch_only_the_long_rows_show(outcomes):
    _, buggy = outcomes
    caught = buggy[("mean", "float16", "accumulation")]
    assert caught.status is Status.MISMATCH, caught.message
    assert "float16 row of" in caught.message, caught.message
    assert buggy[("mean", "float16", "opinfo")].status is Status.PASS, "OpInfo's short rows cannot show it"


def test_linear_cross_entropy_runs_the_accumulation_policy_the_targets_device_resolves(tmp_path):
    """LinearCrossEntropyOptions(acc_policy="auto") keeps float16 logits on any device but the CPU (documented):
    the reference runs the target's policy, so a device that computes PyTorch's documented algorithm passes its
    long rows under the exact profile (they were two false mismatches), while the policy stays the CPU's own
    where the target is the CPU."""
    from op_tests.rules import resolved_for_device

    key = "nn.functional.linear_cross_entropy.chunked"
    selection = OpSelection(patterns=(key + "*",), dtypes=("float16",), strategies=("accumulation",))
    cases = strategy_cases(selection)
    case = next(c for c in cases if c.category == "chunked")
    samples = strategy_samples(get_op(key), case)
    policies = {device: {s.kwargs["options"].acc_policy for s in resolved_for_device(key, samples, device)
                         if s.kwargs.get("options") is not None} for device in ("neuron", "cpu")}
    assert policies == {"neuron": {"compact"}, "cpu": {"accurate"}}, policies
    assert {s.kwargs["options"].acc_policy for s in samples if s.kwargs.get("options")} == {"auto"}, "samples untouched"

    ran = run_cases(tmp_path, cases, "exact", {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact"})
    assert len(ran) == 2
    assert all(o.status is Status.PASS for _, o in ran), [(c.name, o.message[:300]) for c, o in ran]
