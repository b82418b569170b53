"""The pytest routes (``pytest op_tests`` / ``pytest model_zoo``) run real sessions in subprocesses.

Each session runs its cases in the harness's worker pool on the emulated
device; JUnit XML is what CI systems read, so the tests read it back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_pytest(tmp_path: Path, *args: str, faults: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    junit = tmp_path / "out.xml"
    env = {**os.environ, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}
    env.pop("NEURON_VALIDATE_FAULTS", None)
    if faults:
        env["NEURON_VALIDATE_FAULTS"] = faults
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                          f"--junitxml={junit}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    cases = {}
    if junit.exists():
        for tc in ET.parse(junit).getroot().iter("testcase"):
            failure = tc.find("failure")
            skipped = tc.find("skipped")
            cases[tc.get("name")] = ("failed", failure.get("message")) if failure is not None else \
                ("skipped", skipped.get("message")) if skipped is not None else ("passed", "")
    return run, cases


def test_op_route_passes_clean_ops_and_fails_a_perturbed_one(tmp_path):
    run, cases = run_pytest(tmp_path, "op_tests", "--ops", "abs,exp", "--dtypes", "float32",
                            "--directions", "forward", "--max-samples", "3", faults="perturb@aten::exp,rel=0.01")
    assert run.returncode == 1, run.stdout[-2000:]
    assert "PytestAssertRewriteWarning" not in run.stdout
    verdicts = {name.split("[")[1].split(".")[0]: v for name, v in cases.items()}
    assert verdicts["abs"][0] == "passed"
    assert verdicts["exp"][0] == "failed" and verdicts["exp"][1].startswith("Failed: mismatch: sample 0"), verdicts["exp"]


def test_model_route_runs_base_configs_and_reports_bad_selections(tmp_path):
    run, cases = run_pytest(tmp_path, "model_zoo", "--filter", "world/*,molecule/*", "--base")
    assert run.returncode == 0, run.stdout[-2000:]
    assert len(cases) == 4 and all(v[0] == "passed" for v in cases.values()), cases
    bad, _ = run_pytest(tmp_path, "model_zoo", "--filter", "world/rssm_typo", "--base")
    assert bad.returncode == 4, bad.stdout + bad.stderr  # a usage error ...
    assert "unknown model 'world/rssm_typo'" in bad.stderr and "world/rssm" in bad.stderr  # ... naming close names
