"""Compile targets compile a case's samples together: the cost follows graphs, not samples.

A real compiler takes seconds to minutes a graph, so the compile-mode gate compiles one graph per batch of
samples (fullgraph: every sample's op is in it), judges each sample on its own, bisects a batch that fails
to compile or raises down to the samples responsible, and reuses within a build what it compiled.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from conformance.case import Case
from op_tests.samples import generate_samples, sample_parts
from op_tests.sources import get_op

from ..conftest import REPO, run_cli

LATENCY = 0.05


def _ops(tmp_path, *args, env=None, build="b1"):
    jsonl = tmp_path / f"{build}-{len(list(tmp_path.iterdir()))}.jsonl"
    result = run_cli("neuron-conformance", "ops", "--dtypes", "float32", "--directions", "forward",
                     "--target", "neuron:compile", "--results", str(tmp_path / "runs"), "--build", build,
                     "--jsonl", str(jsonl), "--hypothesis-examples", "0", "-j", "1", *args, env=env, timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return [json.loads(line) for line in jsonl.read_text().splitlines()]


def test_samples_compile_in_one_graph_and_a_rerun_in_the_build_compiles_nothing(tmp_path):
    profile = f"exact:compile_seconds_per_graph={LATENCY}"
    first = _ops(tmp_path, "--ops", "tanh", "--strategies", "none", "--emulator-profile", profile)
    (row,) = [r for r in first if r["case"]["config"].get("source") == "opinfo"]
    evidence = row["outcome"]["evidence"]
    assert row["outcome"]["status"] == "pass" and evidence["samples"] > 5
    compile = evidence["compile"]
    assert compile["batches"] == [evidence["samples"]] and compile["graphs"] == 1 and not compile["alone"]
    assert compile["direct"] == 1, "the batch's graph is built without dynamo (conformance/call_graph.py)"
    assert compile["compiler"]["compiled"] == 1, "one graph for every sample"
    assert abs(compile["compiler"]["seconds"] - LATENCY) < 1e-9, "the latency of one graph, not one per sample"
    again = _ops(tmp_path, "--ops", "tanh", "--strategies", "none", "--emulator-profile", profile)
    (row,) = [r for r in again if r["case"]["config"].get("source") == "opinfo"]
    compiler = row["outcome"]["evidence"]["compile"]["compiler"]
    assert compiler["compiled"] == 0 and compiler["cached"] == 1 and compiler["seconds"] == 0
    other = _ops(tmp_path, "--ops", "tanh", "--strategies", "none", "--emulator-profile", profile, build="b2")
    (row,) = [r for r in other if r["case"]["config"].get("source") == "opinfo"]
    assert row["outcome"]["evidence"]["compile"]["compiler"]["compiled"] == 1, "nothing is kept across builds"


def test_a_batch_that_raises_is_bisected_down_to_the_samples_responsible(tmp_path):
    """A compiler that fails only on float64 operands: the samples of the mixed strategy that have one (a
    Python float reaches the dispatcher as a float64 scalar) are errors, every other sample passes."""
    env = {"NEURON_VALIDATE_FAULTS": "raise@aten::add,mode=compile,dtype=float64"}
    rows = _ops(tmp_path, "--ops", "add", "--strategies", "mixed", "--emulator-profile", "exact", env=env)
    (row,) = [r for r in rows if r["case"]["config"].get("inputs") == "mixed"]
    evidence = row["outcome"]["evidence"]
    case = Case(**row["case"])
    wide = [any((isinstance(t, torch.Tensor) and t.dtype == torch.float64) or type(t) is float
                for t in torch.utils._pytree.tree_leaves(sample_parts(s)))
            for s in generate_samples(get_op("add"), case)]
    statuses = evidence["sample_statuses"]
    assert len(statuses) == len(wide) and any(wide) and not all(wide)
    assert [s == "error" for s in statuses] == wide
    assert evidence["compile"]["bisected"] >= 1 and row["outcome"]["status"] == "error"
    # The reproducer compiles its sample as the case did: the fault lives in compiled graphs only.
    repro = subprocess.run([sys.executable, row["outcome"]["repro"]], capture_output=True, text=True, timeout=600,
                           env={**os.environ, **env}, cwd=REPO)
    assert "target raised" in repro.stdout and repro.returncode == 1, repro.stdout + repro.stderr[-2000:]


def test_a_compiler_that_dies_on_one_sample_crashes_that_sample_and_one_that_hangs_times_out_its_case(tmp_path, request):
    """Bad input, for real: the emulated compiler segfaults on graphs where addcmul takes a float64 (a Python
    float ``value``: the second sample), and hangs on any graph with tanh. The worker dies twice on addcmul (the
    batch, then the sample alone), and the case resumes past each death: one sample is a crash, the other
    passes. tanh's case times out alone; sin's, in the same run, passes."""
    # The run's own temporary folders: the crash folder must not outlive the run. Short, not under tmp_path:
    # multiprocessing's sockets live there, and a worker's tmp_path (pytest-of-root/pytest-N/popen-gwK/...)
    # made "OSError: AF_UNIX path too long".
    temp = Path(tempfile.mkdtemp(prefix="nv-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    env = {"NEURON_VALIDATE_FAULTS": "crash@aten::addcmul,mode=compiler,dtype=float64;hang@aten::tanh,mode=compiler",
           "TMPDIR": str(temp)}
    # 25 s: the hang waits that long. The other cases' runs take 0.5-1.3 s at load 14 on 2 cores (a replacement
    # worker's first compile included; its start is not timed), so even a far busier machine stays well inside.
    rows = _ops(tmp_path, "--ops", "addcmul,tanh,sin", "--strategies", "none", "--max-samples", "2",
                "--emulator-profile", "exact", "--timeout", "25", "-j", "2", env=env)
    by_op = {r["case"]["name"]: r["outcome"] for r in rows}
    addcmul = by_op["addcmul"]
    assert addcmul["status"] == "crash" and addcmul["evidence"]["sample_statuses"] == ["pass", "crash"]
    assert "SIGSEGV" in addcmul["message"] and "graph of its own" in addcmul["message"]
    compile = addcmul["evidence"]["compile"]
    assert compile["crashed"] == [1] and compile["deaths"] == 2 and 1 in compile["alone"]
    assert by_op["tanh"]["status"] == "timeout"
    assert by_op["sin"]["status"] == "pass"
    left = list(temp.glob("neuron-validate-faults-*"))
    assert not left, f"the timed-out case's journal kept the run's crash folder: {[p.name for p in left]}"
