"""Opening a results database: refuse what is not one, create an empty one, and set it up for use."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from results.errors import StoreError
from results.identify import APPLICATION_ID, check_file, header
from results.migrations import create as create_schema
from results.schema import SCHEMA_VERSION
from results.wal import use_wal


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """A connection to the store at ``path`` (autocommit: callers open their own transactions), in WAL mode
    with foreign keys on. A missing or empty file becomes a new store when ``create``; a foreign, damaged,
    older or newer file is refused with a :class:`StoreError` and never written to."""
    if not path.exists() and not create:
        raise StoreError(f"no results database at {path}")
    check_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not a usable results database: {exc}") from None
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        app_id, version, tables = header(conn)
        if app_id == 0 and not tables:
            if not create:
                raise StoreError(f"{path} is an empty database, not a results database")
            create_schema(conn)
            app_id, version, tables = header(conn)
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
    return conn
