"""The results store: schema and migrations, refusal of foreign files, durability, merging."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import sys

import pytest

from conformance.case import Case
from conformance.outcome import Outcome, Status
from results.store import (
    APPLICATION_ID,
    MIGRATIONS,
    SCHEMA_V1,
    SCHEMA_VERSION,
    ResultStore,
    StoreError,
    db_path,
    migrate,
    schema_version,
)
from tests.conftest import REPO, run_cli
from tests.results.rows import model, op, write_build


def _v1_store(folder) -> None:
    """A store exactly as schema version 1 shipped it, with one result."""
    folder.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_path(folder), isolation_level=None)
    conn.executescript("BEGIN;" + SCHEMA_V1 + f"PRAGMA application_id={APPLICATION_ID};PRAGMA user_version=1;COMMIT;")
    conn.execute("INSERT INTO builds VALUES ('old', 'neuron', 'neuron (emulated)', 'exact', '2.14.1', '{}', 1.0)")
    case = op("tanh")
    conn.execute("INSERT INTO cases VALUES (?, 'op', '', 'tanh', 'float32', 'forward', '{\"source\": \"opinfo\"}', ?)",
                 (case.id, case.title))
    outcome = Outcome(case_id=case.id, status=Status.PASS, message="16 / 16 samples match")
    conn.execute("INSERT INTO results VALUES ('old', ?, 'pass', '16 / 16 samples match', '{}', NULL, 0.5, '{}', ?, 2.0)",
                 (case.id, json.dumps(outcome.to_dict())))
    resnet = model("timm", "resnet18", "eval")  # its category (the model family) was the column family then
    conn.execute("INSERT INTO cases VALUES (?, 'model', 'timm', 'resnet18', 'float32', 'eval', ?, ?)",
                 (resnet.id, json.dumps(resnet.config), resnet.title))
    conn.execute("INSERT INTO results VALUES ('old', ?, 'pass', '', '{}', NULL, 0.5, '{}', ?, 3.0)",
                 (resnet.id, json.dumps(Outcome(case_id=resnet.id, status=Status.PASS).to_dict())))
    conn.close()


def test_new_store_is_created_through_the_migrations(tmp_path):
    with ResultStore.open(tmp_path) as store:
        version = store.conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = store.conn.execute("PRAGMA application_id").fetchone()[0]
        mode = store.conn.execute("PRAGMA journal_mode").fetchone()[0]
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert (version, app_id, mode) == (SCHEMA_VERSION, APPLICATION_ID, "wal")
    assert {"builds", "cases", "results", "reruns"} <= tables
    assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION)), "one explicit step per version"


def test_rows_round_trip_with_seed_and_relative_artifacts(tmp_path):
    case = Case(kind="op", name="tanh", dtype="float32", mode="forward", seed=7)
    repro = tmp_path / "artifacts" / "repro" / case.id / "repro.py"
    with ResultStore.open(tmp_path) as store:
        store.ensure_build("b1", target="neuron", label="neuron (emulated)", manifest={"torch": "2.14.1"})
        store.record("b1", case, Outcome(case_id=case.id, status=Status.MISMATCH, message="m", repro=str(repro),
                                         evidence={"metrics": {"max_abs": 0.1}, "error": "boom"}))
        (row,) = store.results("b1")
        assert row.case.id == case.id, "the seed is part of the id and must survive the store"
        assert row.outcome.repro == f"artifacts/repro/{case.id}/repro.py"
        assert store.artifact(row.outcome.repro) == repro
        assert [r.case_id for r in store.statuses("b1")] == [case.id]
        assert store.completed("b1") == {case.id}
        metrics, error, artifacts = store.conn.execute("SELECT metrics, error, artifacts FROM results").fetchone()
        assert (metrics, error, artifacts) == ('{"max_abs": 0.1}', "boom", f'{{"repro": "artifacts/repro/{case.id}/repro.py"}}')


def test_each_result_is_committed_on_its_own(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.ensure_build("b1", target="neuron", label="x", manifest={})
        reader = sqlite3.connect(db_path(tmp_path))
        for i, name in enumerate(["a", "b", "c"], 1):
            case = op(name)
            store.record("b1", case, Outcome(case_id=case.id, status=Status.PASS))
            assert reader.execute("SELECT count(*) FROM results").fetchone()[0] == i
        reader.close()


WRITER = """
import sys
from conformance.outcome import Outcome, Status
from results.store import ResultStore
from tests.results.rows import op
store = ResultStore.open(sys.argv[1])
store.ensure_build("b1", target="neuron", label="x", manifest={})
for i in range(100000):
    case = op(f"op{i}")
    store.record("b1", case, Outcome(case_id=case.id, status=Status.PASS))
    print(i, flush=True)
"""


def test_sigkill_loses_no_reported_result(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    reported = -1
    while reported < 200:
        reported = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with ResultStore.open(tmp_path) as store:
        rows = store.conn.execute("SELECT count(*), count(DISTINCT case_id) FROM results").fetchone()
    assert rows[0] == rows[1] >= reported + 1


def test_foreign_and_damaged_files_are_refused_and_left_untouched(tmp_path):
    text = tmp_path / "notes" / "results.sqlite"
    text.parent.mkdir()
    text.write_text("not a database\n")
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    damaged = tmp_path / "damaged" / "results.sqlite"
    damaged.parent.mkdir()
    with ResultStore.open(damaged.parent) as store:
        write_build(store, "b1", [(op(f"o{i}"), "pass") for i in range(200)])
    data = bytearray(damaged.read_bytes())
    data[100:4096] = os.urandom(3996)  # the header survives, the schema page does not
    damaged.write_bytes(bytes(data))
    newer = tmp_path / "newer"
    ResultStore.open(newer).close()
    conn = sqlite3.connect(db_path(newer))
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()

    cases = [(text.parent, "not an SQLite file"), (other, "another program's SQLite database"),
             (damaged.parent, "damaged"), (newer, "newer than this neuron-validate")]
    for where, expected in cases:
        path = db_path(where)
        before = path.read_bytes()
        with pytest.raises(StoreError, match=expected) as info:
            ResultStore.open(where)
        assert "\n" not in str(info.value)
        assert path.read_bytes() == before, f"{path} was modified"
        with pytest.raises(StoreError):
            migrate(where)
        assert path.read_bytes() == before
    r = run_cli("neuron-conformance", "gate", "--results", str(other), "--build", "a", "--baseline", "b")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "another program's" in r.stderr, r.stderr


def test_old_schema_is_refused_until_migrated_explicitly(tmp_path):
    _v1_store(tmp_path)
    with pytest.raises(StoreError, match="neuron-conformance migrate --results"):
        ResultStore.open(tmp_path)
    assert schema_version(tmp_path) == 1
    r = run_cli("neuron-conformance", "migrate", "--results", str(tmp_path))
    assert r.returncode == 0 and f"from schema version 1 to {SCHEMA_VERSION}" in r.stdout, r.stdout + r.stderr
    with ResultStore.open(tmp_path) as store:
        row, model_row = sorted(store.results("old"), key=lambda r: r.case.kind, reverse=True)
        assert row.outcome.message == "16 / 16 samples match" and row.case.id == op("tanh").id
        assert model_row.case == model("timm", "resnet18", "eval"), "the family column is the category, same id"
        assert {r.category for r in store.statuses("old")} == {"", "timm"}
        assert store.reruns("old") == {} and store.infra_retries("old") == {}
    r = run_cli("neuron-conformance", "migrate", "--results", str(tmp_path))
    assert r.returncode == 0 and f"already at schema version {SCHEMA_VERSION}" in r.stdout
    r = run_cli("neuron-conformance", "migrate", "--results", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "no results database" in r.stderr and not (tmp_path / "nowhere").exists()


def test_reruns_are_numbered_per_case(tmp_path):
    case = op("tanh")
    with ResultStore.open(tmp_path) as store:
        write_build(store, "b1", [(case, "mismatch")])
        assert [store.record_rerun("b1", case, Outcome(case_id=case.id, status=s))
                for s in (Status.MISMATCH, Status.PASS)] == [1, 2]
        assert [r.outcome.status for r in store.reruns("b1")[case.id]] == [Status.MISMATCH, Status.PASS]


def test_the_harness_retries_of_a_case_are_recorded_with_its_one_result_and_survive_a_merge(tmp_path):
    case, other = op("tanh"), op("sin")
    retries = [{"node": "n1", "reason": "node lost", "during": "run", "kind": "lost"}]
    with ResultStore.open(tmp_path / "a") as store:
        store.ensure_build("b1", target="neuron", label="neuron", manifest={})
        store.record("b1", case, Outcome(case_id=case.id, status=Status.PASS, evidence={"infra_retries": retries}))
        store.record("b1", other, Outcome(case_id=other.id, status=Status.CRASH, message="worker process died: SIGSEGV"))
        assert store.infra_retries("b1") == {case.id: retries}
        with ResultStore.open(tmp_path / "merged") as merged:
            merged.merge(store)
            assert merged.infra_retries("b1") == {case.id: retries}
            assert merged.counts("b1") == {"crash": 1, "pass": 1}


def test_merge_of_shards_into_one_build(tmp_path):
    cases = [op(f"op{i}") for i in range(6)]
    shards = []
    for k, created in ((0, 200.0), (1, 100.0)):
        folder = tmp_path / f"shard{k}"
        repro = folder / "artifacts" / "repro" / cases[k].id / "repro.py"
        repro.parent.mkdir(parents=True)
        repro.write_text("print('repro')\n")
        with ResultStore.open(folder) as store:
            write_build(store, "b7", [(c, "pass" if i % 2 else "error") for i, c in enumerate(cases) if i % 2 == k],
                        created=created, repros={cases[k].id: str(repro)})
            store.record_rerun("b7", cases[k], Outcome(case_id=cases[k].id, status=Status.PASS, repro=str(repro)))
        shards.append(folder)
    merged = tmp_path / "merged"
    r = run_cli("neuron-conformance", "merge", "--into", str(merged), *map(str, shards))
    assert r.returncode == 0, r.stderr
    r = run_cli("neuron-conformance", "merge", "--into", str(merged), *map(str, shards))  # twice: no change
    with ResultStore.open(merged) as store:
        (build,) = store.builds()
        assert build.id == "b7" and build.created == 100.0, "the build starts when its first shard did"
        rows = list(store.results("b7"))
        assert sorted(r.outcome.case_id for r in rows) == sorted(c.id for c in cases)
        for k in (0, 1):
            row = store.result("b7", cases[k].id)
            assert store.artifact(row.outcome.repro).read_text() == "print('repro')\n"
            assert store.artifact(row.outcome.repro).is_relative_to(merged)
        assert sum(len(v) for v in store.reruns("b7").values()) == 2
        with pytest.raises(StoreError, match="into itself"):
            store.merge(store)
    r = run_cli("neuron-conformance", "merge", "--into", str(merged), str(tmp_path / "missing"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no results database" in r.stderr


def test_concurrent_creation_of_one_store(tmp_path):
    # Processes that open a new store together all get it. Three races once refused one of them: it saw
    # version 1 half-way through the migrations (asked for a migrate), read application_id before and the
    # tables after another's commit (called it a foreign database), or lost the switch to WAL ("locked").
    code = ("import sys, time; from results.store import ResultStore\n"
            "while time.time() < float(sys.argv[2]): pass\n"
            "ResultStore.open(sys.argv[1]).close()")
    for round in range(5):
        start = time.time() + 1.5  # every process past its imports, then all open at once
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / str(round)), str(start)], cwd=REPO,
                                  stderr=subprocess.PIPE, text=True) for _ in range(8)]
        errors = [p.communicate()[1] for p in procs]
        assert all(p.returncode == 0 for p in procs), errors
        assert schema_version(tmp_path / str(round)) == SCHEMA_VERSION


def test_unknown_build_names_close_matches(tmp_path):
    with ResultStore.open(tmp_path) as store:
        write_build(store, "nightly-0412", [(op("tanh"), "pass")])
        with pytest.raises(StoreError, match="did you mean nightly-0412"):
            store.build("nightly-0421")
