"""User scripts are cases: in the store, as a suite, in the gate and in the dashboard.

A team keeps its migration scripts in a folder; ``neuron-conformance scripts DIR`` checks each as
``neuron-validate`` would, per backend build. A build whose device computes a matmul 1% off must show
up as a regression of the scripts that use it, at the gate and on the dashboard.
"""

from __future__ import annotations

import shutil

import pytest

from results.store import ResultStore
from tests.conftest import REPO, built_once, run_cli

FAULT = "perturb@aten::*mm,rel=0.01"
EXACT = {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return built_once(tmp_path_factory, "scripts", _builds)


def _builds(root):
    folder = root / "migration"
    folder.mkdir()
    for name in ("tiny_gpt.py", "vision_classifier.py"):
        shutil.copy(f"{REPO}/examples/{name}", folder / name)
    (folder / "_helpers.py").write_text("X = 1\n")  # not a script of the suite
    runs = {}
    for build, faults in (("clean", ""), ("faulty", FAULT)):
        runs[build] = run_cli("neuron-conformance", "scripts", str(folder), "--results", str(root / "runs"),
                              "--build", build, "-j", "2", env={**EXACT, "NEURON_VALIDATE_FAULTS": faults})
    return root, runs


def test_the_folder_runs_as_a_suite_with_verdicts_in_the_store(builds):
    root, runs = builds
    assert runs["clean"].returncode == 0, runs["clean"].stdout[-3000:] + runs["clean"].stderr[-3000:]
    assert runs["faulty"].returncode == 1, runs["faulty"].stdout[-3000:]
    with ResultStore.open(root / "runs", create=False) as store:
        clean = {r.case.name.rsplit("/", 1)[-1]: r.outcome for r in store.results("clean", kind="script")}
        faulty = {r.case.name.rsplit("/", 1)[-1]: r.outcome for r in store.results("faulty", kind="script")}
    assert set(clean) == set(faulty) == {"tiny_gpt.py", "vision_classifier.py"}
    assert all(o.status.value == "pass" for o in clean.values()), {k: o.message for k, o in clean.items()}
    for name, outcome in faulty.items():
        assert outcome.status.value == "mismatch", (name, outcome.message)
        assert outcome.message.startswith("not ready: ") and outcome.evidence["verdict"] == "not ready"
        assert (root / "runs" / outcome.evidence["artifacts"]["report"]).is_file()


def test_the_gate_reports_each_script_regression(builds):
    root, _ = builds
    gate = run_cli("neuron-conformance", "gate", "--results", str(root / "runs"), "--build", "faulty",
                   "--baseline", "clean", "--rerun", "0")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    regressions = [line for line in gate.stdout.splitlines() if line.startswith("REGRESSION")]
    assert len(regressions) == 2 and all("script:" in line for line in regressions), gate.stdout


def test_the_dashboard_lists_the_scripts_with_their_reports(builds):
    root, _ = builds
    out = root / "site"
    r = run_cli("neuron-conformance", "dashboard", "--results", str(root / "runs"), "--build", "faulty",
                "--baseline", "clean", "--out", str(out))
    assert r.returncode == 0, r.stderr
    html = (out / "index.html").read_text()
    assert 'id="headline-scripts"' in html and "0 of\n    2 ready" in html
    assert html.count("not ready") >= 2 and "tiny_gpt.py" in html and "vision_classifier.py" in html
    assert len(list((out / "scripts").glob("*report.html"))) == 2


def test_neuron_validate_records_its_check_in_the_store(tmp_path):
    r = run_cli("neuron-validate", f"{REPO}/examples/vision_classifier.py", "--out", str(tmp_path / "report"),
                "--results", str(tmp_path / "runs"), "--build", "mine", env=EXACT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "recorded in" in r.stdout
    with ResultStore.open(tmp_path / "runs", create=False) as store:
        (row,) = list(store.results("mine"))
    assert row.case.kind == "script" and row.case.name.endswith("vision_classifier.py")
    assert row.outcome.status.value == "pass" and row.outcome.evidence["verdict"].startswith("ready")
