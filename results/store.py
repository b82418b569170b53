"""The results store: one SQLite database per results folder.

Tables: ``builds`` (one row per backend build that was tested), ``cases``
(what ran, by stable case id) and ``results`` (one outcome per build and
case). The database runs in WAL mode and each result is written in its own
committed transaction, so a run killed with SIGKILL loses nothing it had
reported, and ``--resume`` skips exactly the cases already recorded.

The file carries an application id and a schema version (SQLite's
``application_id`` and ``user_version``). A file that is not SQLite, or is
some other program's database, is refused with a clear error and never
written to. Older schemas are upgraded only by :func:`migrate`, explicitly.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from conformance.case import Case
from conformance.outcome import Outcome, Status

APPLICATION_ID = 0x4E56414C  # "NVAL"
SCHEMA_VERSION = 1
DB_NAME = "results.sqlite"
SQLITE_MAGIC = b"SQLite format 3\x00"

SCHEMA_V1 = """
CREATE TABLE builds (
    id TEXT PRIMARY KEY,
    target TEXT NOT NULL,
    label TEXT NOT NULL,
    backend_version TEXT,
    torch_version TEXT,
    manifest TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE cases (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    family TEXT NOT NULL,
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,
    mode TEXT NOT NULL,
    config TEXT NOT NULL,
    title TEXT NOT NULL
);
CREATE TABLE results (
    build_id TEXT NOT NULL REFERENCES builds(id),
    case_id TEXT NOT NULL REFERENCES cases(id),
    outcome TEXT NOT NULL,
    message TEXT NOT NULL,
    metrics TEXT NOT NULL,
    error TEXT,
    duration REAL NOT NULL,
    artifacts TEXT NOT NULL,
    evidence TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (build_id, case_id)
);
CREATE INDEX results_by_outcome ON results(build_id, outcome);
"""

MIGRATIONS: dict[int, str] = {}  # from version -> SQL that brings it to version + 1


class StoreError(RuntimeError):
    """A results database that cannot be used; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildInfo:
    id: str
    target: str
    label: str
    backend_version: str | None
    torch_version: str | None
    manifest: dict
    created: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRow:
    build_id: str
    case: Case
    title: str
    outcome: Outcome


def _check_file(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        header = f.read(16)
    if header != SQLITE_MAGIC:
        raise StoreError(f"{path} is not a results database (not an SQLite file); refusing to touch it")


def db_path(results: str | Path) -> Path:
    p = Path(results)
    return p if p.suffix in (".sqlite", ".db") else p / DB_NAME


class ResultStore:
    """Open with :meth:`open`; use as a context manager to close it."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    # ---------------------------------------------------------------- opening
    @classmethod
    def open(cls, results: str | Path, *, create: bool = True) -> "ResultStore":
        path = db_path(results)
        if not path.exists() and not create:
            raise StoreError(f"no results database at {path}")
        _check_file(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, timeout=60, isolation_level=None)
            conn.execute("PRAGMA busy_timeout=60000")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a usable results database: {exc}") from None
        if app_id == 0 and not tables:
            if not create:
                raise StoreError(f"{path} is an empty database, not a results database")
            conn.executescript("BEGIN;" + SCHEMA_V1 + f"PRAGMA application_id={APPLICATION_ID};"
                               f"PRAGMA user_version={SCHEMA_VERSION};COMMIT;")
        elif app_id != APPLICATION_ID:
            conn.close()
            raise StoreError(
                f"{path} is another program's SQLite database (application_id {app_id:#x}), not a "
                "neuron-validate results store; refusing to touch it"
            )
        elif version > SCHEMA_VERSION:
            conn.close()
            raise StoreError(f"{path} has schema version {version}, newer than this neuron-validate ({SCHEMA_VERSION})")
        elif version < SCHEMA_VERSION:
            conn.close()
            raise StoreError(
                f"{path} has schema version {version}; upgrade it first with: neuron-conformance migrate --results {path.parent}"
            )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("SELECT count(*) FROM results").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{path} is damaged: {exc}") from None
        return cls(conn, path)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- builds
    def ensure_build(self, build_id: str, *, target: str, label: str, manifest: dict) -> None:
        """Records a build once; later runs of the same build (resume, shards) keep the first record."""
        backend_version = manifest.get("torch_neuronx") or manifest.get("emulator_profile", {}).get("name")
        with self._tx():
            self.conn.execute(
                "INSERT OR IGNORE INTO builds VALUES (?, ?, ?, ?, ?, ?, ?)",
                (build_id, target, label, backend_version, manifest.get("torch"), json.dumps(manifest), time.time()),
            )

    def builds(self) -> list[BuildInfo]:
        rows = self.conn.execute("SELECT * FROM builds ORDER BY created, id").fetchall()
        return [
            BuildInfo(id=r[0], target=r[1], label=r[2], backend_version=r[3], torch_version=r[4],
                      manifest=json.loads(r[5]), created=r[6])
            for r in rows
        ]

    def build(self, build_id: str) -> BuildInfo:
        for b in self.builds():
            if b.id == build_id:
                return b
        known = ", ".join(b.id for b in self.builds()) or "none"
        raise StoreError(f"no build {build_id!r} in {self.path} (builds: {known})")

    # ---------------------------------------------------------------- results
    def _tx(self):
        return _Transaction(self.conn)

    def record(self, build_id: str, case: Case, outcome: Outcome) -> None:
        """Writes one result in its own committed transaction."""
        metrics = outcome.evidence.get("metrics", {})
        error = outcome.evidence.get("error")
        artifacts = {"repro": outcome.repro} if outcome.repro else {}
        with self._tx():
            self.conn.execute(
                "INSERT OR IGNORE INTO cases VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (case.id, case.kind, case.family, case.name, case.dtype, case.mode,
                 json.dumps(case.config, sort_keys=True, default=str), case.title),
            )
            self.conn.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (build_id, case.id, outcome.status.value, outcome.message, json.dumps(metrics, default=str), error,
                 outcome.duration_s, json.dumps(artifacts), json.dumps(outcome.to_dict(), default=str), time.time()),
            )

    def completed(self, build_id: str) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT case_id FROM results WHERE build_id=?", (build_id,))}

    def results(self, build_id: str, *, kind: str | None = None) -> Iterator[ResultRow]:
        query = ("SELECT c.kind, c.name, c.family, c.dtype, c.mode, c.config, c.title, r.evidence "
                 "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=?")
        args: list[Any] = [build_id]
        if kind:
            query += " AND c.kind=?"
            args.append(kind)
        for kind_, name, family, dtype, mode, config, title, evidence in self.conn.execute(query + " ORDER BY c.title", args):
            case = Case(kind=kind_, name=name, family=family, dtype=dtype, mode=mode, config=json.loads(config))
            yield ResultRow(build_id=build_id, case=case, title=title, outcome=Outcome.from_dict(json.loads(evidence)))

    def counts(self, build_id: str) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT outcome, count(*) FROM results WHERE build_id=? GROUP BY outcome ORDER BY outcome", (build_id,)
        ).fetchall())

    def merge(self, other: "ResultStore", *, build_id: str | None = None) -> int:
        """Copies builds, cases and results from another store (shard outputs into one build)."""
        copied = 0
        for b in other.builds():
            if build_id and b.id != build_id:
                continue
            self.ensure_build(b.id, target=b.target, label=b.label, manifest=b.manifest)
            for row in other.results(b.id):
                self.record(b.id, row.case, row.outcome)
                copied += 1
        return copied


class _Transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, *exc) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def migrate(results: str | Path) -> int:
    """Upgrades an older store to the current schema version; returns the new version."""
    path = db_path(results)
    _check_file(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            raise StoreError(f"{path} is not a neuron-validate results store")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:
                raise StoreError(f"{path}: no migration from schema version {version}")
            conn.executescript(f"BEGIN;{step};PRAGMA user_version={version + 1};COMMIT;")
            version += 1
        return version
    finally:
        conn.close()


__all__ = ["ResultStore", "StoreError", "BuildInfo", "ResultRow", "migrate", "db_path", "Status"]
