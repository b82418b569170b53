"""A reference that crashes is never the target's crash.

A CPU kernel may die only in one of the CPU's own steps a case takes (the float64 golden, the second run on
fenced inputs) or only with some leftovers in memory, so that running the reference alone again survives it.
The case's journal says which step the worker was in when it died: a CPU step makes the case a skip that names
the CPU's crash, with no probe needed.
"""

from __future__ import annotations

import json

from ..conftest import REPO, run_cli


def test_a_worker_that_dies_in_the_cpus_own_golden_is_the_cpus_crash(tmp_path):
    jsonl = tmp_path / "out.jsonl"
    env = {"NEURON_VALIDATE_FAULTS": "perturb@aten::neg,rel=0.01", "PYTHONPATH": REPO}
    result = run_cli("neuron-conformance", "ops", "--ops", "neg", "--dtypes", "float32", "--directions", "forward",
                     "--strategies", "none", "--hypothesis-examples", "0", "--max-samples", "2", "--target", "neuron",
                     "--emulator-profile", "exact", "--backend-module", "tests.fixtures.cpu_float64_abort",
                     "--results", str(tmp_path / "runs"), "--jsonl", str(jsonl), "-j", "1", env=env, timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    (row,) = [json.loads(line) for line in jsonl.read_text().splitlines()]
    outcome = row["outcome"]
    assert outcome["status"] == "skip", outcome["message"]
    assert outcome["message"].startswith("the CPU reference alone also dies (SIGABRT) on this case"), outcome["message"]
    assert outcome["evidence"]["reference_crash"] == [0] and outcome["evidence"]["target_status"] == "crash"
