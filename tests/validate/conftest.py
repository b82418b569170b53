"""Runs the installed ``neuron-validate`` command as a user would, and keeps each run's report for the module."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from tests.conftest import REPO, run_cli


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None
    out: str

    def findings(self, check: str | None = None, severity: str | None = None) -> list[dict]:
        return [f for f in (self.report or {}).get("findings", [])
                if (check is None or f["check"] == check) and (severity is None or f["severity"] == severity)]


@pytest.fixture(scope="session")
def validate(tmp_path_factory):
    """validate(*args, env=None) -> Run; the same arguments run once per session (per xdist worker)."""
    cache: dict = {}

    def run(*args: str, env: dict | None = None, timeout: float = 600) -> Run:
        key = (args, tuple(sorted((env or {}).items())))
        if key not in cache:
            out = str(tmp_path_factory.mktemp("validate"))
            full = [*args]
            if "--out" not in args and args and args[0] != "compare":
                full = [args[0], "--out", out, *args[1:]]
            result = run_cli("neuron-validate", *full, env=env, timeout=timeout)
            path = os.path.join(out, "report.json")
            report = json.load(open(path)) if os.path.exists(path) else None
            cache[key] = Run(result.returncode, result.stdout, result.stderr, report, out)
        return cache[key]

    return run


def example(name: str) -> str:
    return os.path.join(REPO, "examples", name)
