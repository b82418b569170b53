"""Catalogs shipped as JSON for one version of a model package (transformers, timm).

A catalog is written by a slow probe of the installed package and records
that package's version; it describes that version only, so a catalog for
another version is never read as if it were current.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def installed_version(package: str) -> str | None:
    """The installed distribution's version, or None where it is not installed."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_shipped(path: Path, package: str, *, empty: dict[str, Any],
                 stale: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """The catalog at ``path`` when it was made for the installed ``package``.

    ``empty`` when the package is not installed; ``stale(version)`` (a live listing) when the file is
    missing or was made for another version.
    """
    version = installed_version(package)
    if version is None:
        return empty
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return stale(version)
    return data if data.get("version") == version else stale(version)
