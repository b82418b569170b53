"""Writing rows: a build once, a result or a rerun in the caller's transaction.

Every write of the store goes through here, so that a result copied from another store (a merge) is
recorded exactly as one recorded by a run.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from conformance.case import Case
from conformance.outcome import Outcome
from results.paths import stored_path
from results.schema import RETRIES_KEY


class Transaction:
    """``with Transaction(conn):`` an immediate (write-locked) transaction, committed unless it raises."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, *exc) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def ensure_build(conn: sqlite3.Connection, build_id: str, *, target: str, label: str, manifest: dict,
                 created: float | None = None) -> None:
    """Records a build once, in its own transaction; later runs of the same build (resume, shards) keep the
    first record, except that a ``created`` given (a merged shard's) moves the start earlier."""
    backend_version = manifest.get("torch_neuronx") or manifest.get("emulator_profile", {}).get("name")
    with Transaction(conn):
        conn.execute(
            "INSERT OR IGNORE INTO builds VALUES (?, ?, ?, ?, ?, ?, ?)",
            (build_id, target, label, backend_version, manifest.get("torch"), json.dumps(manifest),
             time.time() if created is None else created),
        )
        if created is not None:  # a merged shard may have started first
            conn.execute("UPDATE builds SET created=min(created, ?) WHERE id=?", (created, build_id))


def insert_result(conn: sqlite3.Connection, folder: Path, build_id: str, case: Case, outcome: Outcome, *,
                  created: float) -> None:
    """Writes a case (once) and its result for a build (replacing an earlier one), artifact paths stored
    relative to the results folder."""
    record = outcome.to_dict()
    record["repro"] = stored_path(folder, outcome.repro)
    artifacts = {"repro": record["repro"]} if record["repro"] else {}
    # Executors may name further files (loss curves, logs) under evidence["artifacts"].
    extra = outcome.evidence.get("artifacts")
    if isinstance(extra, dict):
        artifacts.update({str(k): stored_path(folder, str(v)) for k, v in extra.items() if v})
        record["evidence"] = {**record["evidence"], "artifacts": {k: v for k, v in artifacts.items() if k != "repro"}}
    conn.execute(
        "INSERT OR IGNORE INTO cases (id, kind, category, name, dtype, mode, config, title, seed) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (case.id, case.kind, case.category, case.name, case.dtype, case.mode,
         json.dumps(case.config, sort_keys=True, default=str), case.title, case.seed),
    )
    retries = outcome.evidence.get(RETRIES_KEY)
    conn.execute(
        "INSERT OR REPLACE INTO results (build_id, case_id, outcome, message, metrics, error, duration, artifacts, "
        "evidence, created, infra_retries) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (build_id, case.id, outcome.status.value, outcome.message,
         json.dumps(outcome.evidence.get("metrics", {}), default=str), outcome.evidence.get("error"),
         outcome.duration_s, json.dumps(artifacts), json.dumps(record, default=str), created,
         len(retries) if isinstance(retries, list) else 0),
    )


def insert_rerun(conn: sqlite3.Connection, build_id: str, case_id: str, attempt: int, record: dict, *,
                 created: float) -> None:
    """Writes one rerun (an outcome's ``to_dict()``, its repro path already as stored)."""
    conn.execute(
        "INSERT OR REPLACE INTO reruns VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (build_id, case_id, attempt, record["status"], record.get("message", ""), json.dumps(record, default=str),
         float(record.get("duration_s", 0.0)), created),
    )
