"""Builds of the emulated device, made once per test session by the real suite.

Three builds of the same small case set, run in parallel into shard-like
folders of their own and merged into one store (the way CI merges shards):
``base`` and ``clean`` without faults, ``faulty`` with one injected fault
(tanh's outputs scaled by 1.01). Under pytest-xdist the builds are shared
by the workers through a file lock, so they are made once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from filelock import FileLock

from tests.conftest import REPO, run_cli

OPS = ("--ops", "tanh,add", "--dtypes", "float32", "--directions", "forward", "--strategies", "none")
FAULT = "perturb@aten::tanh,rel=0.01"
BUILDS = {"base": "", "clean": "", "faulty": FAULT}


def suite_env(faults: str = "") -> dict:
    return {"NEURON_VALIDATE_EMULATOR_PROFILE": "exact", "NEURON_VALIDATE_FAULTS": faults}


def ops_command(results: Path, build: str, *extra: str) -> list[str]:
    exe = os.path.join(os.path.dirname(os.sys.executable), "neuron-conformance")
    return [exe, "ops", *OPS, "--results", str(results), "--build", build, "-j", "1", *extra]


def _make(root: Path) -> None:
    procs = {}
    for build, faults in BUILDS.items():
        procs[build] = subprocess.Popen(ops_command(root / f"shard-{build}", build), cwd=REPO,
                                        env={**os.environ, **suite_env(faults)}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
    for build, proc in procs.items():
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode in (0, 1), out[-3000:]
    r = run_cli("neuron-conformance", "merge", "--into", str(root / "runs"), *(str(root / f"shard-{b}") for b in BUILDS))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="session")
def emulated_builds(tmp_path_factory) -> Path:
    """The results folder holding builds base, clean and faulty."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "emulated_builds"
    with FileLock(str(shared / "emulated_builds.lock")):
        if not (root / "done").exists():
            root.mkdir(exist_ok=True)
            _make(root)
            (root / "done").write_text("ok")
    return root / "runs"
