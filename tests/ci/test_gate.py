"""The gate on real builds of the emulated device that differ by one injected fault."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

from results.store import ResultStore
from tests.ci.conftest import FAULT, ops_command, suite_env
from tests.conftest import REPO, run_cli

ISSUE = "https://github.com/aws-neuron/aws-neuron-sdk/issues/1323"


def gate(results, *args: str):
    return run_cli("neuron-conformance", "gate", "--results", str(results), *args)


def case_ids(results, build: str, name: str) -> set[str]:
    with ResultStore.open(results, create=False) as store:
        return {r.case_id for r in store.statuses(build) if r.name == name}


def reported(stdout: str, label: str) -> set[str]:
    """Case ids of the report lines with this label (each is followed by a 'case ID; ...' line)."""
    lines = stdout.splitlines()
    return {re.match(r"\s+case (\w+)", lines[i + 1]).group(1) for i, line in enumerate(lines) if line.startswith(label + " ")}


def test_gate_names_exactly_the_cases_the_fault_broke(emulated_builds, tmp_path):
    broken = case_ids(emulated_builds, "faulty", "tanh")
    assert len(broken) == 2 and case_ids(emulated_builds, "faulty", "add"), "the case set holds tanh and add"
    junit = tmp_path / "gate.xml"
    r = gate(emulated_builds, "--build", "faulty", "--baseline", "base", "--rerun", "1", "-j", "2", "--junit", str(junit))
    assert r.returncode == 1, r.stdout + r.stderr
    assert reported(r.stdout, "REGRESSION") == broken
    assert "gate FAILED: 2 regressions, 2 pass" in r.stdout
    assert "reruns: mismatch" in r.stdout, "a fault active in every process is no flake"

    suite = ET.parse(junit).getroot().find("testsuite")
    failures = {tc.find("failure").text.split(":")[0].removeprefix("case ")
                for tc in suite.iter("testcase") if tc.find("failure") is not None}
    assert failures == broken and suite.get("failures") == "2" and suite.get("tests") == "4"

    # Each regression names its reproducer, and the reproducer reproduces it.
    scripts = re.findall(r"reproducer: python (\S+)", r.stdout)
    assert len(scripts) == 2
    for script in scripts:
        assert re.search(r"/(\w+)/repro\.py$", script).group(1) in broken
    run = subprocess.run([sys.executable, scripts[0]], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 1 and "Mismatched elements" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]


def test_gate_passes_builds_without_the_fault(emulated_builds):
    r = gate(emulated_builds, "--build", "clean", "--baseline", "base")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gate passed: 4 pass" in r.stdout and "REGRESSION" not in r.stdout


def test_expected_failures_are_not_regressions(emulated_builds, tmp_path):
    expectations = tmp_path / "neuron.toml"
    expectations.write_text(
        'backend = "neuron"\n'
        f'[[failure]]\nname = "tanh"\nreason = "Scalar Engine tanh is 1% off"\nissue = "{ISSUE}"\n'
        f'[[failure]]\nname = "add"\nreason = "used to fail"\nissue = "{ISSUE}"\n')
    junit = tmp_path / "gate.xml"
    r = gate(emulated_builds, "--build", "faulty", "--baseline", "base", "--expectations", str(expectations),
             "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr
    assert reported(r.stdout, "XFAIL") == case_ids(emulated_builds, "faulty", "tanh")
    assert reported(r.stdout, "XPASS") == case_ids(emulated_builds, "faulty", "add")
    assert "remove the entry from the expectations file" in r.stdout
    assert "gate passed: 2 xfail, 2 xpass" in r.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped")) == ("0", "2")


def failing(results, build: str) -> set[str]:
    with ResultStore.open(results, create=False) as store:
        return {r.case_id for r in store.statuses(build) if r.status.value != "pass"}


def test_flaky_fault_is_reported_as_flaky(emulated_builds, tmp_path):
    """``p=0.5``: the fault is active in half the processes. The build is run (two workers, each with
    its own chance of the fault) until the fault struck a case; the gate's reruns, each in a fresh
    process, then meet a process without it."""
    results = tmp_path / "runs"
    shutil.copytree(emulated_builds.parent / "shard-base", results)
    flaky = f"{FAULT},p=0.5"
    for attempt in range(1, 9):  # a run escapes the fault with probability <= 1/2: 8 tries miss it <= 1 in 256
        build = f"flaky-{attempt}"
        proc = subprocess.run(ops_command(results, build, "-j", "2"), cwd=REPO, capture_output=True, text=True,
                              timeout=600, env={**os.environ, **suite_env(flaky)})
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        if proc.returncode == 1:
            break
    else:
        raise AssertionError("the p=0.5 fault never struck in eight runs")
    broken = failing(results, build)
    assert broken and broken <= case_ids(results, build, "tanh")
    r = gate(results, "--build", build, "--baseline", "base", "--rerun", "12", "-j", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert reported(r.stdout, "FLAKY") == broken and "REGRESSION" not in r.stdout
    assert f"gate passed: {len(broken)} flaky, {4 - len(broken)} pass" in r.stdout, r.stdout
    with ResultStore.open(results, create=False) as store:
        reruns = store.reruns(build)
    assert set(reruns) == broken
    assert all(rows[-1].outcome.status.value == "pass" for rows in reruns.values()), "reruns stop at the first pass"


def test_gate_refuses_bad_input_in_one_line(emulated_builds, tmp_path):
    for args, expected in [
        (("--build", "nope", "--baseline", "base"), "no build 'nope'"),
        (("--build", "base", "--baseline", "base"), "a gate compares two builds"),
        (("--build", "faulty", "--baseline", "base", "--rerun", "-1"), "--rerun -1"),
    ]:
        r = gate(emulated_builds, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and expected in r.stderr, r.stderr
    r = gate(tmp_path / "empty", "--build", "a", "--baseline", "b")
    assert r.returncode == 2 and "no results database" in r.stderr
