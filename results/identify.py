"""Telling a results database from any other file, before anything writes to it.

A results database is an SQLite file whose header carries this project's ``application_id``. A file
that is not SQLite, or is another program's database, is refused with a one-line error.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from results.errors import StoreError

APPLICATION_ID = 0x4E56414C  # "NVAL"
SQLITE_MAGIC = b"SQLite format 3\x00"


def check_file(path: Path) -> None:
    """Refuses a folder or a non-SQLite file; a missing or empty file passes (SQLite makes it a database)."""
    if path.is_dir():
        raise StoreError(f"{path} is a folder, not a results database")
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        header = f.read(16)
    if header != SQLITE_MAGIC:
        raise StoreError(f"{path} is not a results database (not an SQLite file); refusing to touch it")


def header(conn: sqlite3.Connection) -> tuple[int, int, set[str]]:
    """The application id, the schema version and the tables, read in one transaction: read one by one,
    another process creating the store could commit between them (application_id 0 with the tables there,
    refused as foreign)."""
    conn.execute("BEGIN")
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.execute("COMMIT")
    return app_id, version, tables
