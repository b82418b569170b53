"""Where a results store keeps its files: the database in a results folder, and artifact paths
recorded relative to that folder, so that a folder can be moved, uploaded by one CI job and
downloaded by another, or merged from shards, and its links still resolve."""

from __future__ import annotations

from pathlib import Path

DB_NAME = "results.sqlite"


def db_path(results: str | Path) -> Path:
    """The database file of a results folder (or the file itself, named ``*.sqlite`` or ``*.db``)."""
    p = Path(results)
    return p if p.suffix in (".sqlite", ".db") else p / DB_NAME


def stored_path(folder: Path, path: str | None) -> str | None:
    """How a store in ``folder`` records a file path: relative to the folder when inside it."""
    if not path:
        return path
    p = Path(path)
    absolute = (p if p.is_absolute() else Path.cwd() / p).resolve()
    try:
        return absolute.relative_to(folder.resolve()).as_posix()
    except ValueError:
        return str(absolute)


def artifact_path(folder: Path, stored: str) -> Path:
    """The file an artifact path recorded by a store in ``folder`` names."""
    p = Path(stored)
    return p if p.is_absolute() else folder / p
