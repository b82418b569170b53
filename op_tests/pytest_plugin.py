"""The pytest route of the operator suite: its cases as parametrized tests.

    pytest op_tests --target neuron -n 2 --junitxml out.xml [--ops GLOB] [--dtypes LIST]

The target options, the worker pool and the verdicts come from
``runner.pytest_plugin``; this plugin adds the selection of ops.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["runner.pytest_plugin"]

CASES_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("neuron-validate-ops", "operator conformance")
    g.addoption("--ops", default="*", help="comma-separated globs over OpInfo names")
    g.addoption("--exclude-ops", default="", help="comma-separated globs to leave out")
    g.addoption("--dtypes", default="", help="comma-separated dtypes (default: all)")
    g.addoption("--directions", default="forward,backward", help="forward, backward or both")
    g.addoption("--max-samples", type=int, default=0, help="at most this many samples per case")


def pytest_configure(config: pytest.Config) -> None:
    """Selects the cases up front, so a bad selection is a usage error (exit 4) with one line."""
    from runner.pytest_plugin import split
    from op_tests.sources import OpSelection, UnknownOpError, op_cases

    opt = config.getoption
    try:
        config.stash[CASES_KEY] = op_cases(OpSelection(
            patterns=split(opt("--ops")) or ("*",),
            exclude=split(opt("--exclude-ops")),
            dtypes=split(opt("--dtypes")),
            directions=split(opt("--directions")),
            max_samples=opt("--max-samples"),
        ))
    except (UnknownOpError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "op_case" in metafunc.fixturenames:
        cases = metafunc.config.stash[CASES_KEY]
        metafunc.parametrize("op_case", cases, ids=[c.title.removeprefix("op:") for c in cases])


@pytest.fixture(scope="session")
def op_runner(pytestconfig):
    from runner.pytest_plugin import open_runner, settings

    pool = open_runner(settings(pytestconfig, "ops", timeout_s=300.0, warmup=("op",)))
    yield pool
    pool.close()
