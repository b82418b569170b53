"""Precision drift: a kernel 50 to 100 times less accurate that still passes is reported, and gated on request.

Three builds of softmax and log_softmax (float32, OpInfo's samples) on the
emulated device: ``before`` and ``again`` clean, ``after`` with a backend
module whose softmax takes exp with 6 mantissa bits cut
(tests/fixtures/accelerator_bugs.py: ``softmax_coarse_exp``). The harness is
not told; the drift comes from the stored metrics of the two builds.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

from ci.drift import precision_drift, precision_trend
from conformance.outcome import Status
from report.dashboard import write_dashboard
from results.store import ResultStore
from tests.conftest import REPO, built_once, run_cli

OPS = ("--ops", "softmax,log_softmax", "--dtypes", "float32", "--directions", "forward", "--strategies", "none",
       "--hypothesis-examples", "0", "--emulator-profile", "exact", "-j", "1")
BUGS = ("--backend-module", "tests.fixtures.accelerator_bugs")


def _builds(root):
    for build, extra, env in (("before", (), {}), ("again", (), {}),
                              ("after", BUGS, {"ACCEL_BUGS": "softmax_coarse_exp", "PYTHONPATH": REPO})):
        r = run_cli("neuron-conformance", "ops", *OPS, *extra, "--results", str(root), "--build", build, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return built_once(tmp_path_factory, "drift", _builds)


def test_a_less_accurate_softmax_that_still_passes_is_a_precision_drift(results):
    with ResultStore.open(results, create=False) as store:
        softmax = next(r for r in store.results("after") if r.case.name == "softmax")
        assert softmax.outcome.status is Status.PASS, softmax.outcome.message
        drift = precision_drift(store, "after", "before")
        assert [d.name for d in drift.drifts] == ["softmax"], [d.describe() for d in drift.drifts]
        assert drift.drifts[0].factor >= 20 and drift.compared == 2, drift.drifts[0].describe()
        assert not precision_drift(store, "again", "before").drifts, "a clean build does not drift from a clean one"
        trend = precision_trend(store, [("softmax", "float32")], ["before", "again", "after"])
        assert trend[("softmax", "float32")][:2] == [0.0, 0.0] and trend[("softmax", "float32")][2] >= 20


def test_the_gate_reports_drift_and_fails_on_it_only_when_asked(results, tmp_path):
    reported = run_cli("neuron-conformance", "gate", "--build", "after", "--baseline", "before",
                       "--results", str(results), "--rerun", "0")
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "DRIFT" in reported.stdout and "softmax" in reported.stdout and "(reported only)" in reported.stdout

    junit = tmp_path / "gate.xml"
    gated = run_cli("neuron-conformance", "gate", "--build", "after", "--baseline", "before", "--results",
                    str(results), "--rerun", "0", "--fail-on-drift", "--junit", str(junit))
    assert gated.returncode == 1, gated.stdout + gated.stderr
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert [f.get("type") for f in failures] == ["precision_drift"]

    clean = run_cli("neuron-conformance", "gate", "--build", "again", "--baseline", "before", "--results",
                    str(results), "--rerun", "0", "--fail-on-drift")
    assert clean.returncode == 0 and "DRIFT" not in clean.stdout, clean.stdout

    bad = run_cli("neuron-conformance", "gate", "--build", "after", "--baseline", "before", "--results",
                  str(results), "--drift-factor", "1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_dashboard_shows_the_drift_and_each_drifting_ops_trend(results, tmp_path):
    with ResultStore.open(results, create=False) as store:
        index = write_dashboard(store, build="after", baseline="before", out=tmp_path / "site")
    html = index.read_text()
    section = html[html.index('id="drift"'):html.index('id="trend"')]
    assert "1 of 2 passing cases" in section and "softmax" in section and "log_softmax" not in section
    assert all(build in section for build in ("before", "again", "after")), "one column per build"
    assert os.path.getsize(index) > 0
