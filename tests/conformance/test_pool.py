"""The local pool's isolation: a segfault or a bloated worker costs one case, not the run.

(Hangs on the local pool are covered by tests/op_tests/test_fault_detection.py; on Ray by
tests/conformance/test_ray_executor.py.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.outcome import Status
from conformance.pool import LocalPool
from conformance.settings import RunSettings
from op_tests.sources import OpSelection, op_cases

REPO = Path(__file__).resolve().parents[2]

FAULTS = "crash@aten::sort"


def cases(*ops: str):
    return op_cases(OpSelection(patterns=ops, dtypes=("float32",), directions=("forward",)))


def settings(tmp_path, **kw) -> RunSettings:
    env = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": FAULTS}
    return RunSettings(target="neuron", timeout_s=kw.pop("timeout_s", 120.0), artifacts_dir=str(tmp_path / "artifacts"),
                       env=env, **kw)


def test_a_segfault_is_a_crash_outcome_and_the_run_goes_on(tmp_path):
    selected = [c for c in cases("tanh", "sort", "add") if c.config["source"] == "opinfo"]
    with LocalPool(settings(tmp_path), jobs=1) as pool:
        got = [o for o in pool.run(selected)]
    assert sorted(o.case_id for o in got) == sorted(c.id for c in selected), "every case has exactly one outcome"
    by_name = {c.name: o for c in selected for o in got if o.case_id == c.id}
    crash = by_name["sort"]
    assert crash.status is Status.CRASH and "worker process died: SIG" in crash.message, crash
    assert by_name["tanh"].status is Status.PASS and by_name["add"].status is Status.PASS
    # Written by the replacement worker, since the dead one cannot.
    assert crash.repro and Path(crash.repro).is_file(), crash.evidence


def test_rss_cap_stops_the_worker(tmp_path):
    (case,) = [c for c in cases("tanh") if c.config["source"] == "opinfo"]
    with LocalPool(settings(tmp_path, rss_limit_mb=64), jobs=1) as pool:
        (outcome,) = pool.run([case])
    # The worker is stopped and the case marked. Below an interpreter's own size the reference alone
    # (the probe that follows a crash) cannot fit either, so the case cannot be judged: a skip that
    # keeps the target's crash as evidence.
    assert outcome.status is Status.SKIP and "exceeded the RSS cap: " in outcome.message
    assert "the CPU reference alone also exceeds the RSS cap" in outcome.message
    assert outcome.evidence["rss_limit_mb"] == 64 and outcome.evidence["target_status"] == "crash"


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match=r"jobs=0 \(type=int\): must be >= 1"):
        LocalPool(settings(tmp_path), jobs=0)


def test_workers_die_with_a_killed_run(tmp_path):
    """SIGKILL of the run alone (not its process group) must not leave workers computing."""
    import psutil

    script = tmp_path / "run.py"
    script.write_text(
        "import time\n"
        "from conformance.pool import LocalPool\n"
        "from conformance.settings import RunSettings\n"
        "if __name__ == '__main__':\n"
        "    pool = LocalPool(RunSettings(target='cpu'), jobs=2, persistent=True)\n"
        "    workers = [pool._spawn() for _ in range(2)]\n"
        "    assert [w.conn.recv()[0] for w in workers] == ['ready', 'ready']\n"
        "    print(' '.join(str(w.process.pid) for w in workers), flush=True)\n"
        "    time.sleep(600)\n")
    run = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pids = [int(p) for p in run.stdout.readline().split()]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    run.kill()
    run.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                              for p in pids):
        time.sleep(0.1)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
