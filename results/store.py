"""The results store: one SQLite database per results folder, read and written through :class:`ResultStore`.

The database runs in WAL mode and each result is written in its own committed transaction, so a run
killed with SIGKILL loses nothing it had reported, and ``--resume`` skips exactly the cases already
recorded. Artifact paths (reproducers, loss curves) inside the results folder are stored relative to
it, so a results folder can be moved or merged from shards and its links still resolve
(:meth:`ResultStore.artifact`).

The store's other jobs live in modules of their own, and the names callers use are importable from
here too:

- :mod:`results.paths`: the database's file in a results folder, and how artifact paths are stored;
- :mod:`results.identify`: telling a results database from any other file;
- :mod:`results.schema` and :mod:`results.migrations`: the tables, and how a new or old store is
  brought to the current version (only :func:`migrate` upgrades an old one);
- :mod:`results.wal`: the switch to write-ahead logging;
- :mod:`results.connection`: opening a database, refusing what it cannot use;
- :mod:`results.rows` and :mod:`results.writes`: what reads return, and every write;
- :mod:`results.merge`: copying builds from another store.
"""

from __future__ import annotations

import difflib
import json
import sqlite3
import time
from pathlib import Path
from typing import Iterable, Iterator

from conformance.case import Case
from conformance.outcome import Outcome, Status
from results.connection import connect
from results.errors import StoreError
from results.identify import APPLICATION_ID
from results.merge import copy_builds
from results.migrations import migrate, schema_version
from results.paths import DB_NAME, artifact_path, db_path, stored_path
from results.rows import (CASE_COLUMNS, BuildInfo, PrecisionRow, RerunRow, ResultRow, StatusRow, build_from_row,
                          case_from_columns)
from results.schema import MIGRATIONS, RETRIES_KEY, SCHEMA_V1, SCHEMA_VERSION
from results.wal import use_wal
from results.writes import Transaction, ensure_build, insert_rerun, insert_result


class ResultStore:
    """Open with :meth:`open`; use as a context manager to close it."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path

    @classmethod
    def open(cls, results: str | Path, *, create: bool = True) -> "ResultStore":
        """The store of a results folder (or database file); a new one is created unless ``create=False``."""
        path = db_path(results)
        return cls(connect(path, create=create), path)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def folder(self) -> Path:
        """The results folder: artifact paths are relative to it."""
        return self.path.parent

    def artifact(self, stored: str) -> Path:
        """The file an artifact path from this store names."""
        return artifact_path(self.folder, stored)

    def relative(self, path: str | None) -> str | None:
        """How this store records a file path: relative to the results folder when inside it."""
        return stored_path(self.folder, path)

    # ---------------------------------------------------------------- builds
    def ensure_build(self, build_id: str, *, target: str, label: str, manifest: dict,
                     created: float | None = None) -> None:
        """Records a build once; later runs of the same build (resume, shards) keep the first record."""
        ensure_build(self.conn, build_id, target=target, label=label, manifest=manifest, created=created)

    def builds(self) -> list[BuildInfo]:
        return [build_from_row(r) for r in self.conn.execute("SELECT * FROM builds ORDER BY created, id")]

    def build(self, build_id: str) -> BuildInfo:
        builds = self.builds()
        for b in builds:
            if b.id == build_id:
                return b
        ids = [b.id for b in builds]
        close = difflib.get_close_matches(build_id, ids, n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        known = ", ".join(ids[-8:]) or "none"
        raise StoreError(f"no build {build_id!r} in {self.path}{hint} (builds: {known})")

    # ---------------------------------------------------------------- results
    def record(self, build_id: str, case: Case, outcome: Outcome) -> None:
        """Writes one result in its own committed transaction."""
        with Transaction(self.conn):
            insert_result(self.conn, self.folder, build_id, case, outcome, created=time.time())

    def set_artifact(self, build_id: str, case_id: str, name: str, path: str) -> None:
        """Adds an artifact written after the run (e.g. the gate's reproducer) to a recorded result."""
        stored = self.relative(path)
        with Transaction(self.conn):
            row = self.conn.execute("SELECT artifacts, evidence FROM results WHERE build_id=? AND case_id=?",
                                    (build_id, case_id)).fetchone()
            if row is None:
                raise StoreError(f"no result for case {case_id} in build {build_id!r}")
            artifacts, record = json.loads(row[0]), json.loads(row[1])
            artifacts[name] = stored
            if name == "repro":
                record["repro"] = stored
            else:
                record.setdefault("evidence", {}).setdefault("artifacts", {})[name] = stored
            self.conn.execute("UPDATE results SET artifacts=?, evidence=? WHERE build_id=? AND case_id=?",
                              (json.dumps(artifacts), json.dumps(record, default=str), build_id, case_id))

    def artifacts(self, build_id: str) -> dict[str, dict[str, str]]:
        """The artifact paths each result of a build names, by case id (as stored: see :meth:`artifact`)."""
        return {case_id: json.loads(a) for case_id, a in self.conn.execute(
            "SELECT case_id, artifacts FROM results WHERE build_id=? AND artifacts != '{}'", (build_id,))}

    def completed(self, build_id: str) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT case_id FROM results WHERE build_id=?", (build_id,))}

    _ROW_QUERY = (f"SELECT {CASE_COLUMNS}, c.title, r.evidence "
                  "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=?")

    @staticmethod
    def _row(build_id: str, row: tuple) -> ResultRow:
        *case_columns, title, evidence = row
        return ResultRow(build_id=build_id, case=case_from_columns(*case_columns), title=title,
                         outcome=Outcome.from_dict(json.loads(evidence)))

    def results(self, build_id: str, *, kind: str | None = None,
                statuses: Iterable[Status | str] | None = None) -> Iterator[ResultRow]:
        """Full rows (case and outcome with its evidence), by title; optionally only some kinds or statuses."""
        query, args = self._ROW_QUERY, [build_id]
        if kind:
            query += " AND c.kind=?"
            args.append(kind)
        if statuses is not None:
            wanted = [str(s) for s in statuses]
            query += f" AND r.outcome IN ({','.join('?' * len(wanted))})"
            args.extend(wanted)
        for row in self.conn.execute(query + " ORDER BY c.title", args):
            yield self._row(build_id, row)

    def result(self, build_id: str, case_id: str) -> ResultRow | None:
        row = self.conn.execute(self._ROW_QUERY + " AND r.case_id=?", (build_id, case_id)).fetchone()
        return None if row is None else self._row(build_id, row)

    def statuses(self, build_id: str) -> list[StatusRow]:
        """Every result of a build without its evidence, by title (cheap enough for every build in a trend)."""
        rows = self.conn.execute(
            "SELECT r.case_id, c.kind, c.category, c.name, c.dtype, c.mode, c.title, r.outcome, r.message, r.duration "
            "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=? ORDER BY c.title", (build_id,))
        return [StatusRow(case_id=r[0], kind=r[1], category=r[2], name=r[3], dtype=r[4], mode=r[5], title=r[6],
                          status=Status(r[7]), message=r[8], duration=r[9]) for r in rows]

    def precision(self, build_id: str) -> dict[str, PrecisionRow]:
        """The worst errors of a build's passing cases with float outputs, by case id (read with SQLite's JSON
        functions, without loading the evidence into Python): one query per build, cheap enough for a trend."""
        rows = self.conn.execute(
            "SELECT r.case_id, c.name, c.category, c.dtype, c.mode, c.title, json_extract(r.metrics, '$.max_ulp'), "
            "coalesce(json_extract(r.metrics, '$.max_rel'), 0), coalesce(json_extract(r.evidence, '$.evidence.samples'), 0) "
            "FROM results r JOIN cases c ON c.id = r.case_id "
            "WHERE r.build_id=? AND r.outcome='pass' AND json_extract(r.metrics, '$.max_ulp') IS NOT NULL",
            (build_id,))
        return {r[0]: PrecisionRow(case_id=r[0], name=r[1], category=r[2], dtype=r[3], mode=r[4], title=r[5],
                                   max_ulp=float(r[6]), max_rel=float(r[7]), samples=int(r[8])) for r in rows}

    def infra_retries(self, build_id: str) -> dict[str, list[dict]]:
        """The harness's retries of a build's cases (node, reason, kind), by case id: what the report names
        apart from the backend's failures."""
        return {case_id: json.loads(evidence).get("evidence", {}).get(RETRIES_KEY, []) for case_id, evidence in
                self.conn.execute("SELECT case_id, evidence FROM results WHERE build_id=? AND infra_retries > 0",
                                  (build_id,))}

    def counts(self, build_id: str) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT outcome, count(*) FROM results WHERE build_id=? GROUP BY outcome ORDER BY outcome", (build_id,)
        ).fetchall())

    # ---------------------------------------------------------------- reruns
    def record_rerun(self, build_id: str, case: Case, outcome: Outcome) -> int:
        """Records one rerun of a case of a build (the gate's flaky check); returns its attempt number."""
        record = outcome.to_dict()
        record["repro"] = self.relative(outcome.repro)
        with Transaction(self.conn):
            attempt = self.conn.execute(
                "SELECT coalesce(max(attempt), 0) + 1 FROM reruns WHERE build_id=? AND case_id=?",
                (build_id, case.id)).fetchone()[0]
            insert_rerun(self.conn, build_id, case.id, attempt, record, created=time.time())
        return attempt

    def reruns(self, build_id: str) -> dict[str, list[RerunRow]]:
        """Reruns of a build's cases, by case id, in attempt order."""
        out: dict[str, list[RerunRow]] = {}
        for case_id, attempt, evidence in self.conn.execute(
                "SELECT case_id, attempt, evidence FROM reruns WHERE build_id=? ORDER BY case_id, attempt", (build_id,)):
            out.setdefault(case_id, []).append(
                RerunRow(build_id=build_id, case_id=case_id, attempt=attempt, outcome=Outcome.from_dict(json.loads(evidence))))
        return out

    # ---------------------------------------------------------------- merging
    def merge(self, other: "ResultStore", *, build_id: str | None = None) -> int:
        """Copies builds (all, or ``build_id``), their cases, results, reruns and artifacts from another store;
        returns the number of results copied. How, and in which transactions: :mod:`results.merge`."""
        if other.path.resolve() == self.path.resolve():
            raise StoreError(f"cannot merge {self.path} into itself")
        builds = [other.build(build_id)] if build_id else other.builds()  # an unknown build_id raises, naming the builds
        return copy_builds(self.conn, self.folder, other.conn, other.folder, builds)


__all__ = ["ResultStore", "StoreError", "BuildInfo", "ResultRow", "StatusRow", "RerunRow", "PrecisionRow", "migrate",
           "schema_version",
           "db_path", "use_wal", "Status", "SCHEMA_VERSION", "SCHEMA_V1", "MIGRATIONS", "APPLICATION_ID", "DB_NAME",
           "RETRIES_KEY"]
