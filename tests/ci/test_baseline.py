"""Verdicts of one build against a baseline; the gate and the dashboard share them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ci.baseline import Verdict, classify, compare_builds
from ci.expectations import load_expectations
from ci.gate import GateOptions, run_gate
from ci.hooks import Hooks
from ci.junit import JUnitReporter
from conformance.outcome import Status
from results.store import ResultStore
from tests.results.rows import op, write_build

P, M, S, C = Status.PASS, Status.MISMATCH, Status.SKIP, Status.CRASH


@pytest.mark.parametrize("baseline, current, known, verdict", [
    (P, M, False, Verdict.REGRESSION),
    (P, C, True, Verdict.XFAIL),
    (M, P, False, Verdict.FIXED),
    (M, P, True, Verdict.XPASS),
    (M, C, False, Verdict.STILL_FAILING),
    (None, M, False, Verdict.NEW_FAILURE),
    (S, M, False, Verdict.NEW_FAILURE),
    (P, None, False, Verdict.MISSING),
    (M, None, False, None),
    (P, S, False, Verdict.SKIP),
    (None, P, False, Verdict.PASS),
    (P, Status.CPU_FALLBACK, False, Verdict.REGRESSION),
])
def test_classify(baseline, current, known, verdict):
    assert classify(baseline, current, object() if known else None) == verdict


@pytest.fixture
def store(tmp_path):
    a, b, c, d, e, f = (op(n) for n in ("abs", "neg", "exp", "sin", "cos", "tan"))
    with ResultStore.open(tmp_path / "runs") as s:
        write_build(s, "old", [(a, "pass"), (b, "pass"), (c, "error"), (d, "pass"), (e, "mismatch"), (f, "pass")],
                    created=1.0)
        write_build(s, "new", [(a, "pass"), (b, "mismatch"), (c, "pass"), (e, "mismatch"), (f, "crash")], created=2.0)
        yield s


def test_compare_builds(store):
    cmp = compare_builds(store, "new", "old")
    verdicts = {c.case.name: c.verdict for c in cmp.changes}
    assert verdicts == {"abs": Verdict.PASS, "neg": Verdict.REGRESSION, "exp": Verdict.FIXED,
                        "sin": Verdict.MISSING, "cos": Verdict.STILL_FAILING, "tan": Verdict.REGRESSION}
    assert [c.case.name for c in cmp.changes[:3]] == ["neg", "tan", "sin"], "most important first"


def test_gate_verdicts_exit_code_and_junit(store, tmp_path):
    exp = tmp_path / "neuron.toml"
    exp.write_text('[[failure]]\nname = "tan"\nreason = "crashes in the runtime"\n'
                   'issue = "https://github.com/aws-neuron/aws-neuron-sdk/issues/1"\n'
                   '[[failure]]\nname = "exp"\nreason = "was broken"\nissue = "https://github.com/o/r/issues/2"\n')
    calls = []

    class Recorder:
        def gate_start(self, report):
            calls.append("start")

        def gate_finish(self, report):
            calls.append("finish")

    junit = tmp_path / "gate.xml"
    options = GateOptions(expectations=load_expectations(exp), write_repros=False)
    report = run_gate(store, build="new", baseline="old", options=options,
                      hooks=Hooks([Recorder(), JUnitReporter(junit)]))
    assert calls == ["start", "finish"]
    counts = {k: v for k, v in report.comparison.counts.items() if v}
    assert counts == {"regression": 1, "missing": 1, "xfail": 1, "xpass": 1, "still_failing": 1, "pass": 1}
    assert report.exit_code == 1 and [c.case.name for c in report.failing] == ["neg", "sin"]
    allowed = run_gate(store, build="new", baseline="old",
                       options=GateOptions(expectations=options.expectations, allow_missing=True, write_repros=False))
    assert [c.case.name for c in allowed.failing] == ["neg"]

    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("6", "2", "2", "0")
    by_name = {tc.get("classname"): tc for tc in suite.iter("testcase")}
    assert by_name["op.neg"].find("failure").get("type") == "regression"
    assert by_name["op.sin"].find("failure").get("type") == "missing"
    assert by_name["op.tan"].find("skipped").get("type") == "xfail"
    assert "crashes in the runtime" in by_name["op.tan"].find("skipped").get("message")
    assert by_name["op.exp"].find("system-out").text.startswith("xpass")
    assert len(by_name["op.abs"]) == 0


def test_hooks_refuse_misspelt_hooks():
    class Typo:
        def gate_finsh(self, report):
            pass

    with pytest.raises(TypeError, match="Typo.gate_finsh: no such gate hook; did you mean gate_finish"):
        Hooks([Typo()])


def test_gate_fails_closed_when_reruns_cannot_start(tmp_path):
    """A gate run where the build's backend is absent (here: a CUDA build on a machine without CUDA)
    cannot rerun; its regressions stay regressions, and it says why."""
    case = op("neg")
    with ResultStore.open(tmp_path) as store:
        write_build(store, "old", [(case, "pass")], target="cuda", created=1.0)
        write_build(store, "new", [(case, "mismatch")], target="cuda", created=2.0)
        store.conn.execute("UPDATE builds SET manifest=? WHERE id='new'", ('{"target": "cuda", "env": {}}',))
        report = run_gate(store, build="new", baseline="old", options=GateOptions(reruns=2, write_repros=False))
    assert report.exit_code == 1 and [c.case.name for c in report.regressions] == ["neg"]
    assert any("reruns stopped" in n and "CUDA" in n for n in report.notes), report.notes


def test_a_baseline_keeps_its_model_cases_across_a_rename_and_the_id_change(tmp_path, monkeypatch):
    """A renamed architecture (a registry alias) and a case stored when ids hashed every config field are
    found under their ids of today, not reported missing; a case that is really gone still is."""
    from dataclasses import replace

    from model_zoo import ModelConfig, registry
    from model_zoo.execute import model_case
    from model_zoo.registry import ModelEntry, Registry

    zoo = Registry()
    zoo.add(ModelEntry(name="toy/new", modality="text", builder=lambda config, entry: None, sizes=(8,)))
    zoo.register_alias("toy/old", "toy/new")
    monkeypatch.setattr(registry, "current_name", zoo.current_name)
    renamed = ModelConfig(arch="toy/old", batch=2, size=8)
    evaluated = ModelConfig(arch="toy/new", batch=1, size=8, mode="eval")
    stored_whole = replace(model_case(evaluated), config=evaluated.to_dict())  # None knobs, defaults, all of it
    gone = model_case(ModelConfig(arch="toy/gone", batch=2, size=8))
    now_renamed, now_evaluated = model_case(zoo.resolve(renamed)), model_case(evaluated)
    assert model_case(renamed).id != now_renamed.id and stored_whole.id != now_evaluated.id
    with ResultStore.open(tmp_path / "runs") as s:
        write_build(s, "old", [(model_case(renamed), "pass"), (stored_whole, "pass"), (gone, "pass")], created=1.0)
        write_build(s, "new", [(now_renamed, "mismatch"), (now_evaluated, "pass")], created=2.0)
        verdicts = {c.case_id: c.verdict for c in compare_builds(s, "new", "old").changes}
    assert verdicts == {now_renamed.id: Verdict.REGRESSION, now_evaluated.id: Verdict.PASS, gone.id: Verdict.MISSING}
