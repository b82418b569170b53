"""Paths as users read them: relative to their working directory (no torch here: the CLIs import it early)."""

from __future__ import annotations

import os

# A process running in a directory of its own (a script's side, validate/execute.py) names the user's here.
DISPLAY_ROOT_ENV = "NEURON_VALIDATE_DISPLAY_ROOT"


def short_path(path: str) -> str:
    """``path`` relative to the user's working directory when it is inside it, else as it is."""
    try:
        rel = os.path.relpath(path, os.environ.get(DISPLAY_ROOT_ENV) or os.getcwd())
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path
