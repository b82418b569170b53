"""A run killed with SIGKILL halfway, then resumed, ends where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time

from results.store import ResultStore, db_path
from tests.conftest import REPO

OPS = ("--ops", "tanh,add,sigmoid,exp,sin,cos,neg,abs", "--dtypes", "float32", "--directions", "forward",
       "--strategies", "none")
ENV = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact",
       "NEURON_VALIDATE_FAULTS": "perturb@aten::exp,rel=0.01;raise@aten::sin"}  # mismatches and errors too


def command(results, *extra: str) -> list[str]:
    exe = os.path.join(os.path.dirname(os.sys.executable), "neuron-conformance")
    return [exe, "ops", *OPS, "--results", str(results), "--build", "nightly", "-j", "1", *extra]


def start(results, *extra: str) -> subprocess.Popen:
    # A run killed with SIGKILL cannot remove its crash folder: it goes into the test's own temporary folder.
    temp = results.parent / "tmp"
    temp.mkdir(exist_ok=True)
    return subprocess.Popen(command(results, *extra), cwd=REPO, env={**os.environ, **ENV, "TMPDIR": str(temp)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def recorded(results) -> int:
    try:
        conn = sqlite3.connect(db_path(results), timeout=5)
        try:
            return conn.execute("SELECT count(*) FROM results").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error:  # not created yet
        return 0


def outcomes(results) -> dict[str, str]:
    with ResultStore.open(results, create=False) as store:
        rows = store.conn.execute("SELECT case_id, outcome FROM results WHERE build_id='nightly'").fetchall()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids))
    return dict(rows)


def test_sigkill_halfway_then_resume_equals_uninterrupted_run(tmp_path):
    total = len(subprocess.run(command(tmp_path / "list", "--list"), cwd=REPO, env={**os.environ, **ENV},
                               capture_output=True, text=True, check=True).stdout.splitlines())
    assert total >= 12
    whole = start(tmp_path / "whole")  # the uninterrupted run, alongside
    killed = start(tmp_path / "killed")
    deadline = time.monotonic() + 600
    while recorded(tmp_path / "killed") < total // 2:
        assert killed.poll() is None, killed.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)  # the parent and its workers, as a machine or CI job dies
    killed.wait()
    at_kill = recorded(tmp_path / "killed")
    assert total // 2 <= at_kill < total, "killed halfway"

    resumed = subprocess.run(command(tmp_path / "killed", "--resume"), cwd=REPO, env={**os.environ, **ENV},
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 1, resumed.stdout[-3000:]  # the faults make findings
    assert f"resumed: {at_kill} cases already had results" in resumed.stdout
    assert f"{total - at_kill} cases ran" in resumed.stdout
    whole_out = whole.communicate(timeout=600)[0]
    assert whole.returncode == 1, whole_out[-3000:]

    expected, got = outcomes(tmp_path / "whole"), outcomes(tmp_path / "killed")
    assert len(expected) == total
    assert got == expected
    assert {"pass", "mismatch", "error"} <= set(got.values())


def test_the_summary_names_the_harness_retries_apart_from_the_backend_failures():
    from runner.suite import SuiteSummary

    summary = SuiteSummary(build_id="b", total=3, ran=3, skipped_resume=0)
    assert summary.retries_line == ""
    summary.add_retries([{"node": "n1", "reason": "node lost", "kind": "lost"},
                         {"node": "n2", "reason": "node lost", "kind": "lost"}])
    summary.add_retries([{"node": None, "reason": "the memory cap of 4096 MiB was shared ...", "kind": "memory"}])
    assert summary.retries_line.startswith("harness retries: 2 cases ran again for causes outside the backend "
                                           "(memory cap shared by both sides x1, node lost x2)"), summary.retries_line
    assert summary.failures == 0


def test_a_run_starts_with_untimed_cases_then_the_longest():
    from conformance.case import Case
    from runner.suite import longest_first

    cases = [Case(kind="model", name=f"m{i}", config={"i": i}) for i in range(5)]
    durations = {cases[0].id: 1.0, cases[1].id: 30.0, cases[3].id: 5.0}
    assert [c.name for c in longest_first(cases, durations)] == ["m2", "m4", "m1", "m3", "m0"]
    assert longest_first(cases, {}) == cases
