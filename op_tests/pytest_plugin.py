"""The pytest route: the operator suite's cases as parametrized tests.

    pytest op_tests --target neuron -n 2 --junitxml out.xml [--ops GLOB] [--dtypes LIST]

Each test runs its case in a worker process of the harness's own pool (one
per pytest process), so a crash or hang fails that test, not the session.
State lives on the pytest config object, not in globals.
"""

from __future__ import annotations

import os

import pytest

SETTINGS_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("neuron-validate", "operator conformance")
    g.addoption("--target", default="neuron", help="DEVICE[:MODE] to test (default: neuron)")
    g.addoption("--reference", default="cpu", help="reference target (default: cpu)")
    g.addoption("--backend-module", action="append", default=[], help="module that registers a backend")
    g.addoption("--emulator-profile", default=None, help="numerics profile of the emulated neuron device")
    g.addoption("--ops", default="*", help="comma-separated globs over OpInfo names")
    g.addoption("--exclude-ops", default="", help="comma-separated globs to leave out")
    g.addoption("--dtypes", default="", help="comma-separated dtypes (default: all)")
    g.addoption("--directions", default="forward,backward", help="forward, backward or both")
    g.addoption("--max-samples", type=int, default=0, help="at most this many samples per case")
    g.addoption("--case-timeout", type=float, default=300.0, help="seconds per case")


def pytest_configure(config: pytest.Config) -> None:
    from conformance.emulator.profiles import PROFILE_ENV, resolve_profile
    from conformance.settings import RunSettings

    profile = config.getoption("--emulator-profile")
    if profile:
        resolve_profile(profile)  # fails the session early on a bad name
        os.environ[PROFILE_ENV] = profile
    modules = tuple(config.getoption("--backend-module"))
    if modules:
        os.environ["NEURON_VALIDATE_EMULATOR_AUTOLOAD"] = "0"
    config.stash[SETTINGS_KEY] = RunSettings(
        target=config.getoption("--target"),
        reference=config.getoption("--reference"),
        backend_modules=modules,
        timeout_s=config.getoption("--case-timeout"),
        warmup=("op_tests.sources:op_db",),
    )


def _split(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "op_case" not in metafunc.fixturenames:
        return
    from op_tests.sources import OpSelection, op_cases

    opt = metafunc.config.getoption
    cases = op_cases(OpSelection(
        patterns=_split(opt("--ops")) or ("*",),
        exclude=_split(opt("--exclude-ops")),
        dtypes=_split(opt("--dtypes")),
        directions=_split(opt("--directions")),
        max_samples=opt("--max-samples"),
    ))
    metafunc.parametrize("op_case", cases, ids=[c.title.removeprefix("op:") for c in cases])


@pytest.fixture(scope="session")
def op_runner(pytestconfig):
    from conformance.pool import LocalPool

    pool = LocalPool(pytestconfig.stash[SETTINGS_KEY], jobs=1, persistent=True)
    yield pool
    pool.close()


def check_outcome(outcome) -> None:
    """Turns an Outcome into a pytest verdict."""
    from conformance.outcome import Status

    if outcome.status is Status.PASS:
        return
    if outcome.status is Status.SKIP:
        pytest.skip(outcome.message)
    pytest.fail(f"{outcome.status.value}: {outcome.message}", pytrace=False)
