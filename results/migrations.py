"""Bringing a store to :data:`results.schema.SCHEMA_VERSION`: a new one at once, an old one explicitly.

What the code does, exactly:

- **A new store** (:func:`create`, called when a store is opened on an empty database): one
  ``BEGIN IMMEDIATE`` transaction runs the version-1 schema, then the SQL of every migration in
  order, then stamps ``application_id`` and ``user_version = SCHEMA_VERSION``. A process that opens
  the file meanwhile sees either nothing or the finished store, never an older version half-way
  (which it would refuse). Two processes racing to create it: the second finds tables there and
  writes nothing. So every migration's SQL runs on every new store, but not the upgrade path below
  (one step per transaction, the version re-read under the lock).
- **An old store** (:func:`migrate`, the ``neuron-conformance migrate`` command, never implicitly):
  the file must be SQLite with this project's ``application_id``, not newer than this code, and
  pass ``PRAGMA quick_check`` (a damaged file is never migrated). Then :func:`upgrade` runs each
  step from the file's version up in its own ``BEGIN IMMEDIATE`` transaction that also sets
  ``user_version`` to the step's target version and commits. The version is re-read under the
  lock, so a step another process ran meanwhile is skipped, and a migration that is killed leaves
  the file at the last committed version, from which ``migrate`` resumes.
- **Opening** a store (:meth:`results.store.ResultStore.open`) never migrates: an older version is
  refused with the command to run, a newer one with a request for a newer neuron-validate.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from results.errors import StoreError
from results.identify import APPLICATION_ID, check_file
from results.paths import db_path
from results.schema import MIGRATIONS, SCHEMA_V1, SCHEMA_VERSION, statements


def create(conn: sqlite3.Connection) -> None:
    """Writes the current schema into an empty database in one transaction (see the module's docstring)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            for statement in statements(SCHEMA_V1):
                conn.execute(statement)
            for version in range(1, SCHEMA_VERSION):
                for statement in statements(MIGRATIONS[version]):
                    conn.execute(statement)
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def upgrade(conn: sqlite3.Connection, path: Path) -> int:
    """Brings a checked database to SCHEMA_VERSION, one committed transaction per step; returns the version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise StoreError(f"{path}: no migration from schema version {version}")
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated it while we waited for the lock.
            if conn.execute("PRAGMA user_version").fetchone()[0] == version:
                for statement in statements(step):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version={version + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def _existing_file(results: str | Path) -> Path:
    """The database file of a results folder, which must exist and be SQLite."""
    path = db_path(results)
    if not path.is_file():
        raise StoreError(f"no results database at {path}")
    check_file(path)
    return path


def schema_version(results: str | Path) -> int:
    """The schema version of a store, read without changing it."""
    path = _existing_file(results)
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
    path = _existing_file(results)
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
            return upgrade(conn, path)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is damaged or not a results database: {exc}") from None
