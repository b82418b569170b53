"""Shared fixtures: the emulated device with a chosen profile, and faults.

Tests use the real emulated device (a PrivateUse1 backend), real worker
processes and real SQLite files; nothing is mocked.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
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


# Session fixtures that hand out a cache (a run per distinct command line), not one run: their modules stay spread.
_NOT_A_SHARED_RUN = {"validate", "worker_id"}
_FIXTURE = re.compile(r'@pytest\.fixture\(scope="(module|session)"\)\s*\ndef (\w+)')


@functools.cache
def _shares_one_run(module: str) -> bool:
    """Whether a test module's tests read one expensive run: it defines a module- or session-scoped fixture (a
    ``built_once`` suite run, a Ray cluster, a dashboard), or asks for a session fixture of a conftest above it."""
    path = Path(REPO, module)
    text = path.read_text()
    if _FIXTURE.search(text):
        return True
    for folder in path.parents:
        conftest = folder / "conftest.py"
        if conftest.is_file() and conftest != Path(__file__):
            names = {m.group(2) for m in _FIXTURE.finditer(conftest.read_text())} - _NOT_A_SHARED_RUN
            if any(re.search(rf"\b{name}\b", text) for name in names):
                return True
        if folder == Path(REPO):
            return False
    return False


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (-p no:xdist) it is never called
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (xdist's ``load``): every test goes where there is room, except that a module whose tests read
    one expensive run goes whole to one worker. Spread over two, one worker sat on the other's ``built_once``
    lock (46 s for the reference-cache run) or built a module fixture again (a Ray cluster). xdist's own
    ``loadgroup`` cannot do this under pytest 9 (it renames node ids, which pytest 9 no longer lets it)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        """Units of work: a shared-run module whole, any other test alone; the modules first (the largest
        first), then the other tests in collection order (pytest_collection_modifyitems below)."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _shares_one_run(module) else nodeid

    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(items):
    # The longest tests first (whole suites, real ranks, user scripts run twice over), quick unit tests last: two
    # workers then end together instead of one finishing a minute-long test while the other idles.
    items.sort(key=lambda item: _LONGEST_FIRST.get(item.nodeid.split("/")[1] if "/" in item.nodeid else "",
                                                   len(_LONGEST_FIRST)))


_LONGEST_FIRST = {name: rank for rank, name in enumerate(
    ("distributed", "validate", "runner", "op_tests", "ci", "model_zoo", "report"))}


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
