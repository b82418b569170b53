"""The results store: one SQLite database per results folder.

Tables: ``builds`` (one row per backend build that was tested), ``cases``
(what ran, by stable case id) and ``results`` (one outcome per build and
case). The database runs in WAL mode and each result is written in its own
committed transaction, so a run killed with SIGKILL loses nothing it had
reported, and ``--resume`` skips exactly the cases already recorded.

The file carries an application id and a schema version (SQLite's
``application_id`` and ``user_version``). A file that is not SQLite, or is
some other program's database, is refused with a clear error and never
written to. Older schemas are upgraded only by :func:`migrate`, explicitly;
a new store is created as version 1 and brought up through the very same
migrations, so every migration runs on every fresh store, not only on the
rare old file.

Artifact paths (reproducers, loss curves) inside the results folder are
stored relative to it, so a results folder can be moved, uploaded by one CI
job and downloaded by another, or merged from shards, and its links still
resolve (:meth:`ResultStore.artifact`).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from conformance.case import Case
from conformance.outcome import Outcome, Status

APPLICATION_ID = 0x4E56414C  # "NVAL"
SCHEMA_VERSION = 3
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

# The schema as version 1 shipped it; kept verbatim: new stores start here and migrate.
MIGRATIONS: dict[int, str] = {  # from version -> SQL that brings it to version + 1
    # 2: the case seed (part of the case id, so rows rebuild the right Case), and the gate's reruns.
    1: """
ALTER TABLE cases ADD COLUMN seed INTEGER NOT NULL DEFAULT 0;
CREATE TABLE reruns (
    build_id TEXT NOT NULL REFERENCES builds(id),
    case_id TEXT NOT NULL REFERENCES cases(id),
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    message TEXT NOT NULL,
    evidence TEXT NOT NULL,
    duration REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (build_id, case_id, attempt)
);
""",
    # 3: how many times the harness ran a case again for a reason outside the backend (a lost node, a killed
    # worker, the memory cap shared by both sides); the retries themselves (node, reason) are in the evidence.
    2: """
ALTER TABLE results ADD COLUMN infra_retries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX results_with_retries ON results(build_id, infra_retries);
""",
}
RETRIES_KEY = "infra_retries"  # the outcome's evidence: the retries runner.supervisor made, [{node, reason, ...}]


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


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusRow:
    """One result without its evidence: what summaries over many builds need, cheaply."""

    case_id: str
    kind: str
    family: str
    name: str
    dtype: str
    mode: str
    title: str
    status: Status
    message: str
    duration: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RerunRow:
    build_id: str
    case_id: str
    attempt: int
    outcome: Outcome


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a results database")
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        header = f.read(16)
    if header != SQLITE_MAGIC:
        raise StoreError(f"{path} is not a results database (not an SQLite file); refusing to touch it")


def db_path(results: str | Path) -> Path:
    p = Path(results)
    return p if p.suffix in (".sqlite", ".db") else p / DB_NAME


def _statements(sql: str) -> list[str]:
    return [s.strip() for s in sql.split(";") if s.strip()]


def _apply_migrations(conn: sqlite3.Connection, path: Path) -> int:
    """Brings the database to SCHEMA_VERSION, one committed transaction per step."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise StoreError(f"{path}: no migration from schema version {version}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated it while we waited for the lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] == version:
                for statement in _statements(step):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={version + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def use_wal(conn: sqlite3.Connection, wait_s: float = 60.0) -> None:
    """Switches the database to write-ahead logging (persistent, once per file). The switch needs the file
    to itself, and SQLite answers "locked" at once, without the busy timeout, while another process reads
    it: processes that open one database together (a store, the reference cache) would lose the race, so
    the switch is retried. A file system without shared memory keeps the rollback journal: slower, correct."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def _json_or_empty(text: str | None) -> dict:
    return json.loads(text) if text else {}


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
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a usable results database: {exc}") from None
        try:
            conn.execute("PRAGMA busy_timeout=60000")
            app_id, version, tables = cls._identify(conn)
            if app_id == 0 and not tables:
                if not create:
                    raise StoreError(f"{path} is an empty database, not a results database")
                cls._create(conn)
                app_id, version, tables = cls._identify(conn)
            if app_id != APPLICATION_ID:
                raise StoreError(
                    f"{path} is another program's SQLite database (application_id {app_id:#x}), not a "
                    "neuron-validate results store; refusing to touch it"
                )
            if version > SCHEMA_VERSION:
                raise StoreError(f"{path} has schema version {version}, newer than this neuron-validate "
                                 f"({SCHEMA_VERSION}); use a newer neuron-validate")
            if version < SCHEMA_VERSION:
                raise StoreError(f"{path} has schema version {version}; upgrade it first with: "
                                 f"neuron-conformance migrate --results {path.parent}")
            use_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("SELECT count(*) FROM results").fetchone()
        except StoreError:
            conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{path} is damaged or not a results database: {exc}") from None
        return cls(conn, path)

    @staticmethod
    def _identify(conn: sqlite3.Connection) -> tuple[int, int, set[str]]:
        """The header fields and tables, read in one transaction: read one by one, another process creating
        the store could commit between them (application_id 0 with the tables there, refused as foreign)."""
        conn.execute("BEGIN")
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.execute("COMMIT")
        return app_id, version, tables

    @staticmethod
    def _create(conn: sqlite3.Connection) -> None:
        """Writes the current schema into an empty database: version 1 and every migration in one
        transaction, so that a process opening the file meanwhile (two may race to create it) never sees
        an older version half-way, which it would refuse to open."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                for statement in _statements(SCHEMA_V1):
                    conn.execute(statement)
                for version in range(1, SCHEMA_VERSION):
                    for statement in _statements(MIGRATIONS[version]):
                        conn.execute(statement)
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

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
        p = Path(stored)
        return p if p.is_absolute() else self.folder / p

    def relative(self, path: str | None) -> str | None:
        """How this store records a file path: relative to the results folder when inside it."""
        if not path:
            return path
        p = Path(path)
        absolute = (p if p.is_absolute() else Path.cwd() / p).resolve()
        try:
            return absolute.relative_to(self.folder.resolve()).as_posix()
        except ValueError:
            return str(absolute)

    # ---------------------------------------------------------------- builds
    def ensure_build(self, build_id: str, *, target: str, label: str, manifest: dict,
                     created: float | None = None) -> None:
        """Records a build once; later runs of the same build (resume, shards) keep the first record."""
        backend_version = manifest.get("torch_neuronx") or manifest.get("emulator_profile", {}).get("name")
        with self._tx():
            self.conn.execute(
                "INSERT OR IGNORE INTO builds VALUES (?, ?, ?, ?, ?, ?, ?)",
                (build_id, target, label, backend_version, manifest.get("torch"), json.dumps(manifest),
                 time.time() if created is None else created),
            )
            if created is not None:  # a merged shard may have started first
                self.conn.execute("UPDATE builds SET created=min(created, ?) WHERE id=?", (created, build_id))

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
        import difflib

        ids = [b.id for b in self.builds()]
        close = difflib.get_close_matches(build_id, ids, n=2)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        known = ", ".join(ids[-8:]) or "none"
        raise StoreError(f"no build {build_id!r} in {self.path}{hint} (builds: {known})")

    # ---------------------------------------------------------------- results
    def _tx(self):
        return _Transaction(self.conn)

    def record(self, build_id: str, case: Case, outcome: Outcome) -> None:
        """Writes one result in its own committed transaction."""
        with self._tx():
            self._insert(build_id, case, outcome, created=time.time())

    def _insert(self, build_id: str, case: Case, outcome: Outcome, *, created: float) -> None:
        record = outcome.to_dict()
        record["repro"] = self.relative(outcome.repro)
        artifacts = {"repro": record["repro"]} if record["repro"] else {}
        # Executors may name further files (loss curves, logs) under evidence["artifacts"].
        extra = outcome.evidence.get("artifacts")
        if isinstance(extra, dict):
            artifacts.update({str(k): self.relative(str(v)) for k, v in extra.items() if v})
            record["evidence"] = {**record["evidence"], "artifacts": {k: v for k, v in artifacts.items() if k != "repro"}}
        self.conn.execute(
            "INSERT OR IGNORE INTO cases (id, kind, family, name, dtype, mode, config, title, seed) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (case.id, case.kind, case.family, case.name, case.dtype, case.mode,
             json.dumps(case.config, sort_keys=True, default=str), case.title, case.seed),
        )
        retries = outcome.evidence.get(RETRIES_KEY)
        self.conn.execute(
            "INSERT OR REPLACE INTO results (build_id, case_id, outcome, message, metrics, error, duration, artifacts, "
            "evidence, created, infra_retries) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (build_id, case.id, outcome.status.value, outcome.message,
             json.dumps(outcome.evidence.get("metrics", {}), default=str), outcome.evidence.get("error"),
             outcome.duration_s, json.dumps(artifacts), json.dumps(record, default=str), created,
             len(retries) if isinstance(retries, list) else 0),
        )

    def set_artifact(self, build_id: str, case_id: str, name: str, path: str) -> None:
        """Adds an artifact written after the run (e.g. the gate's reproducer) to a recorded result."""
        stored = self.relative(path)
        with self._tx():
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

    _ROW_QUERY = ("SELECT c.kind, c.name, c.family, c.dtype, c.mode, c.config, c.seed, c.title, r.evidence "
                  "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=?")

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
        for kind_, name, family, dtype, mode, config, seed, title, evidence in self.conn.execute(query + " ORDER BY c.title", args):
            case = Case(kind=kind_, name=name, family=family, dtype=dtype, mode=mode, config=json.loads(config),
                        seed=seed)
            yield ResultRow(build_id=build_id, case=case, title=title, outcome=Outcome.from_dict(json.loads(evidence)))

    def result(self, build_id: str, case_id: str) -> ResultRow | None:
        query = self._ROW_QUERY + " AND r.case_id=?"
        row = self.conn.execute(query, (build_id, case_id)).fetchone()
        if row is None:
            return None
        kind_, name, family, dtype, mode, config, seed, title, evidence = row
        case = Case(kind=kind_, name=name, family=family, dtype=dtype, mode=mode, config=json.loads(config), seed=seed)
        return ResultRow(build_id=build_id, case=case, title=title, outcome=Outcome.from_dict(json.loads(evidence)))

    def statuses(self, build_id: str) -> list[StatusRow]:
        """Every result of a build without its evidence, by title (cheap enough for every build in a trend)."""
        rows = self.conn.execute(
            "SELECT r.case_id, c.kind, c.family, c.name, c.dtype, c.mode, c.title, r.outcome, r.message, r.duration "
            "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=? ORDER BY c.title", (build_id,))
        return [StatusRow(case_id=r[0], kind=r[1], family=r[2], name=r[3], dtype=r[4], mode=r[5], title=r[6],
                          status=Status(r[7]), message=r[8], duration=r[9]) for r in rows]

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
        with self._tx():
            attempt = self.conn.execute(
                "SELECT coalesce(max(attempt), 0) + 1 FROM reruns WHERE build_id=? AND case_id=?",
                (build_id, case.id)).fetchone()[0]
            self._insert_rerun(build_id, case.id, attempt, record, created=time.time())
        return attempt

    def _insert_rerun(self, build_id: str, case_id: str, attempt: int, record: dict, *, created: float) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO reruns VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (build_id, case_id, attempt, record["status"], record.get("message", ""), json.dumps(record, default=str),
             float(record.get("duration_s", 0.0)), created),
        )

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
        """Copies builds, cases, results and reruns from another store (shard outputs into one build),
        and its artifacts folder into this one; returns the number of results copied.

        All of one store goes in one transaction: a merge that is killed leaves nothing half-copied, and
        merging the same shard twice changes nothing.
        """
        if other.path.resolve() == self.path.resolve():
            raise StoreError(f"cannot merge {self.path} into itself")
        builds = [b for b in other.builds() if not build_id or b.id == build_id]
        if build_id and not builds:
            other.build(build_id)  # raises, naming the builds it has
        copied = 0
        for b in builds:
            self.ensure_build(b.id, target=b.target, label=b.label, manifest=b.manifest, created=b.created)
        source = other.folder / "artifacts"
        if source.is_dir():
            shutil.copytree(source, self.folder / "artifacts", dirs_exist_ok=True)
        with self._tx():
            for b in builds:
                for row in other.conn.execute(
                        "SELECT r.created, c.kind, c.name, c.family, c.dtype, c.mode, c.config, c.seed, r.evidence "
                        "FROM results r JOIN cases c ON c.id = r.case_id WHERE r.build_id=?", (b.id,)):
                    created, kind, name, family, dtype, mode, config, seed, evidence = row
                    case = Case(kind=kind, name=name, family=family, dtype=dtype, mode=mode,
                                config=json.loads(config), seed=seed)
                    outcome = Outcome.from_dict(json.loads(evidence))
                    outcome = self._rebase(other, outcome)
                    self._insert(b.id, case, outcome, created=created)
                    copied += 1
                for case_id, attempt, evidence, created in other.conn.execute(
                        "SELECT case_id, attempt, evidence, created FROM reruns WHERE build_id=?", (b.id,)):
                    record = json.loads(evidence)
                    if record.get("repro"):
                        record["repro"] = self.relative(str(self._rebase_path(other, record["repro"])))
                    self._insert_rerun(b.id, case_id, attempt, record, created=created)
        return copied

    def _rebase_path(self, other: "ResultStore", stored: str) -> Path:
        """Where a file the other store names lives after its artifacts were copied here."""
        source = other.artifact(stored)
        try:
            return self.folder / source.resolve().relative_to(other.folder.resolve())
        except ValueError:
            return source

    def _rebase(self, other: "ResultStore", outcome: Outcome) -> Outcome:
        if outcome.repro:
            outcome.repro = str(self._rebase_path(other, outcome.repro))
        extra = outcome.evidence.get("artifacts")
        if isinstance(extra, dict):
            outcome.evidence["artifacts"] = {k: str(self._rebase_path(other, v)) for k, v in extra.items() if v}
        return outcome


class _Transaction:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, *exc) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def schema_version(results: str | Path) -> int:
    """The schema version of a store, read without changing it."""
    path = db_path(results)
    if not path.is_file():
        raise StoreError(f"no results database at {path}")
    _check_file(path)
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA user_version").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is damaged or not a results database: {exc}") from None


def migrate(results: str | Path) -> int:
    """Upgrades an older store to the current schema version, explicitly; returns the new version."""
    path = db_path(results)
    if not path.is_file():
        raise StoreError(f"no results database at {path}")
    _check_file(path)
    try:
        conn = sqlite3.connect(path, timeout=60, isolation_level=None)
        try:
            if conn.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
                raise StoreError(f"{path} is not a neuron-validate results store; refusing to touch it")
            old = conn.execute("PRAGMA user_version").fetchone()[0]
            if old > SCHEMA_VERSION:
                raise StoreError(f"{path} has schema version {old}, newer than this neuron-validate ({SCHEMA_VERSION})")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]  # never migrate a damaged file
            if check != "ok":
                raise StoreError(f"{path} is damaged ({check}); not migrating it")
            return _apply_migrations(conn, path)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is damaged or not a results database: {exc}") from None


__all__ = ["ResultStore", "StoreError", "BuildInfo", "ResultRow", "StatusRow", "RerunRow", "migrate", "schema_version", "db_path",
           "Status", "SCHEMA_VERSION"]
