"""Shared fixtures: the emulated device with a chosen profile, and faults.

Tests use the real emulated device (a PrivateUse1 backend), real worker
processes and real SQLite files; nothing is mocked.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Callable, TypeVar

import pytest
import torch
from filelock import FileLock

import emulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

T = TypeVar("T")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
    """``build(folder)`` once for the whole run, whichever xdist workers ask (a file lock; the others load its
    pickled result): a fixture that runs a suite is not run again on every worker its tests were spread to."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    result = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if not result.exists():
            folder = shared / name
            folder.mkdir(exist_ok=True)
            result.write_bytes(pickle.dumps(build(folder)))
    return pickle.loads(result.read_bytes())


@pytest.fixture
def neuron():
    """The emulated device under the exact profile, with faults cleared afterwards."""
    emulator.register()
    emulator.set_profile("exact")
    emulator.set_faults("")
    torch.neuron.clear_op_tracking()
    yield torch.device("neuron")
    emulator.set_profile("exact")
    emulator.set_faults("")


@pytest.fixture
def profile(neuron):
    """Call with a profile spec to activate it for the test."""

    def activate(spec):
        return emulator.set_profile(spec)

    return activate


def run_python(code: str, *, env: dict | None = None, timeout: float = 120, cwd: str | None = None):
    """Runs code in a fresh interpreter (as a user's script would run)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=cwd or REPO)


def run_cli(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None):
    """Runs one of the installed commands (neuron-conformance, neuron-validate) in a subprocess."""
    exe = os.path.join(os.path.dirname(sys.executable), args[0])
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([exe, *args[1:]], capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=cwd or REPO)
