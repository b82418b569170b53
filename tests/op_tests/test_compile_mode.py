"""Compile targets compile every sample: a fault that exists only in compiled code fails every sample it can show in.

Dynamo keys its caches by code object and, past its recompile limit, runs a
function eagerly without a word. A harness that reuses one callable for many
samples would then test the eager kernels under a compile target and pass a
broken compiler. These tests load compile-only faults (one in inductor, one
in the emulated device's graphs) and check that no sample got away.
"""

from __future__ import annotations

import json
import torch

from conformance.case import Case
from conformance.outcome import Status
from conformance.target import EAGER_UNDER_COMPILE, TargetSpec, resolve_target
from diff.judge import Judge
from op_tests.execute import judge_sample, run_op
from op_tests.rules import rule_for
from op_tests.samples import generate_samples, sample_parts
from op_tests.sources import get_op

from ..conftest import REPO, run_cli

FAULT_REL = 0.005
FP32_ATOL = 1e-5


def _visible(sample) -> bool:
    """Whether a 0.5% error in tanh of this sample exceeds float32's tolerances somewhere."""
    x = sample.input.detach().double()
    y = torch.tanh(x)
    finite = torch.isfinite(y)
    return bool(((y[finite].abs() * FAULT_REL) > FP32_ATOL * 2).any()) if y.numel() else False


def _run(tmp_path, target, *extra, env=None):
    jsonl = tmp_path / "out.jsonl"
    result = run_cli("neuron-conformance", "ops", "--ops", "tanh", "--dtypes", "float32", "--directions", "forward",
                     "--target", target, "--results", str(tmp_path / "runs"), "--jsonl", str(jsonl),
                     "--hypothesis-examples", "16", "--strategies", "none", "-j", "2", *extra, env=env)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    return rows, result.stdout + result.stderr


def _assert_every_visible_sample_fails(rows, log):
    assert "recompile_limit" not in log and "recompile limit" not in log
    assert len(rows) == 2  # OpInfo's samples and the hypothesis samples
    for row in rows:
        outcome = row["outcome"]
        evidence = outcome["evidence"]
        assert outcome["status"] == Status.MISMATCH.value, outcome["message"]
        case = Case(**row["case"])
        visible = [_visible(s) for s in generate_samples(get_op("tanh"), case)]
        statuses = evidence["sample_statuses"]
        assert len(statuses) == len(visible)
        missed = [i for i, (v, s) in enumerate(zip(visible, statuses)) if v and s != "mismatch"]
        assert not missed, f"{row['title']}: samples {missed} passed a compile-only fault"
        assert sum(visible) >= 9
        assert evidence["compiled_graphs"] == [1] * len(statuses), "each sample compiles one graph of its own"


def test_inductor_only_fault_fails_every_sample_under_cpu_compile(tmp_path):
    rows, log = _run(tmp_path, "cpu:compile", "--backend-module", "tests.fixtures.inductor_tanh_fault",
                     env={"PYTHONPATH": REPO})
    _assert_every_visible_sample_fails(rows, log)


def test_emulated_compile_only_fault_fails_every_sample_under_neuron_compile(tmp_path):
    env = {"NEURON_VALIDATE_FAULTS": f"perturb@aten::tanh,rel={FAULT_REL},mode=compile",
           "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}
    rows, log = _run(tmp_path, "neuron:compile", env=env)
    _assert_every_visible_sample_fails(rows, log)
    eager, _ = _run(tmp_path / "eager", "neuron", env=env)
    assert {row["outcome"]["status"] for row in eager} == {Status.PASS.value}, "the fault lives in graphs only"


def test_one_callable_compiled_past_the_recompile_limit_still_compiles():
    target = resolve_target(TargetSpec.parse("cpu:compile"))
    shared = lambda x: torch.sin(x) * 2  # noqa: E731 - one code object, as a per-sample lambda is
    limit = torch._dynamo.config.recompile_limit
    for n in range(1, limit + 4):
        compiled = target.compile(shared)
        x = torch.randn(n, n + 1)
        assert torch.allclose(compiled(x), torch.sin(x) * 2)
        assert compiled.graphs == 1, f"call {n} ran eagerly"


def test_a_sample_that_ran_eagerly_under_a_compile_target_is_a_harness_error():
    def nothing_to_compile(x):
        torch._dynamo.graph_break()
        return x

    target = resolve_target(TargetSpec.parse("cpu:compile"))
    op = get_op("tanh")
    sample = generate_samples(op, Case(kind="op", name="tanh", dtype="float32", mode="forward",
                                       config={"source": "opinfo", "max_samples": 1}))[0]
    parts = sample_parts(sample)
    result = run_op(op, rule_for("tanh"), sample, parts, backward=False, device="cpu", seed=0,
                    prepare=lambda fn: target.compile(nothing_to_compile))
    assert result.graphs == 0
    reference = run_op(op, rule_for("tanh"), sample, parts, backward=False, device="cpu", seed=0)
    verdict = judge_sample(0, op, rule_for("tanh"), sample, parts, reference, result, backward=False, seed=0,
                           judge=Judge(tolerance=None), nondeterministic=[])
    assert verdict.status is Status.ERROR and EAGER_UNDER_COMPILE in verdict.message
