"""Runs the installed ``neuron-validate`` command as a user would, once per distinct command line.

Runs are cached on disk under the session's shared temporary root, keyed by
the arguments and environment, with a file lock, so pytest-xdist workers
share them instead of repeating a 10-second run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass

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
def validate(tmp_path_factory, worker_id):
    """validate(*args, env=None) -> Run of ``neuron-validate SCRIPT --out DIR *args``."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if worker_id != "master" else base) / "validate-runs"
    shared.mkdir(exist_ok=True)

    def run(*args: str, env: dict | None = None, timeout: float = 600) -> Run:
        key = hashlib.sha1(json.dumps([args, sorted((env or {}).items())]).encode()).hexdigest()[:16]
        out = shared / key
        record = shared / f"{key}.json"
        with open(shared / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not record.exists():
                out.mkdir(exist_ok=True)
                result = run_cli("neuron-validate", args[0], "--out", str(out), *args[1:], env=env, timeout=timeout)
                path = out / "report.json"
                report = json.loads(path.read_text()) if path.exists() else None
                record.write_text(json.dumps(asdict(Run(result.returncode, result.stdout, result.stderr, report,
                                                        str(out)))))
        return Run(**json.loads(record.read_text()))

    return run


@pytest.fixture(scope="session")
def worker_id(request):
    """The xdist worker id ("master" without xdist); pytest-xdist provides the same fixture when installed."""
    return getattr(request.config, "workerinput", {}).get("workerid", "master")


def example(name: str) -> str:
    return os.path.join(REPO, "examples", name)
