"""The switch to SQLite's write-ahead log, which lets readers and one writer work together."""

from __future__ import annotations

import sqlite3
import time


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
