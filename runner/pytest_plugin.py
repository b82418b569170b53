"""What the pytest routes of the suites share: the target options, the worker pool, verdicts.

``op_tests/pytest_plugin.py`` and ``model_zoo/pytest_plugin.py`` require
this plugin, so ``pytest op_tests model_zoo --target neuron`` registers the
options once. Each test runs its case in a worker process of the harness's
own supervisor (one worker per suite and pytest process, so ``-n 2`` gives
two), so a crash or hang fails that test, not the session. State lives on the
pytest config object, not in globals: one settings object per suite, so with
``pytest op_tests model_zoo`` the model cases get the models' timeout and
warm-up, not whichever suite asked first.
"""

from __future__ import annotations

import os

import pytest

SETTINGS_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("neuron-validate", "neuron-validate target")
    g.addoption("--target", default="neuron", help="DEVICE[:MODE] to test (default: neuron)")
    g.addoption("--reference", default="cpu", help="reference target (default: cpu)")
    g.addoption("--backend-module", action="append", default=[], help="module that registers a backend")
    g.addoption("--emulator-profile", default=None, help="numerics profile of the emulated neuron device")
    g.addoption("--case-timeout", type=float, default=None, help="seconds per case (default: 300 ops, 600 models)")
    g.addoption("--artifacts", default=None, help="folder for the reproducers of failing cases")
    g.addoption("--rss-limit-mb", type=int, default=4096, help="stop a worker above this RSS (default 4096)")


def pytest_configure(config: pytest.Config) -> None:
    from emulator.profiles import PROFILE_ENV, resolve_profile

    profile = config.getoption("--emulator-profile")
    if profile:
        resolve_profile(profile)  # fails the session early on a bad name
        os.environ[PROFILE_ENV] = profile
    if config.getoption("--backend-module"):
        os.environ["NEURON_VALIDATE_EMULATOR_AUTOLOAD"] = "0"


def settings(config: pytest.Config, suite: str, *, timeout_s: float, warmup: tuple[str, ...] = ()):
    """The RunSettings of one suite (``ops``, ``models``) in this session, made once from the command line."""
    from conformance.settings import RunSettings, default_threads

    per_suite = config.stash.setdefault(SETTINGS_KEY, {})
    if suite not in per_suite:
        per_suite[suite] = RunSettings(
            target=config.getoption("--target"),
            reference=config.getoption("--reference"),
            backend_modules=tuple(config.getoption("--backend-module")),
            timeout_s=config.getoption("--case-timeout") or timeout_s,
            rss_limit_mb=config.getoption("--rss-limit-mb"),
            artifacts_dir=config.getoption("--artifacts"),
            warmup=warmup,
            # pytest-xdist's -n N runs N sessions, each with its worker: one share of the cores each.
            threads=default_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))),
        )
    return per_suite[suite]


def split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def open_runner(settings_):
    """A persistent single-worker supervisor; the caller closes it."""
    from runner.supervisor import Supervisor

    return Supervisor(settings_, jobs=1, persistent=True)


def check_outcome(outcome) -> None:
    """Turns an Outcome into a pytest verdict: pass, skip with its reason, or a failure naming the outcome."""
    from conformance.outcome import Status

    if outcome.status is Status.PASS:
        return
    if outcome.status is Status.SKIP:
        pytest.skip(outcome.message)
    if outcome.status is Status.INCONCLUSIVE:  # cannot be judged, and never a pass
        pytest.skip(f"inconclusive: {outcome.message}")
    where = f" (reproducer: {outcome.repro})" if outcome.repro else ""
    pytest.fail(f"{outcome.status.value}: {outcome.message}{where}", pytrace=False)
