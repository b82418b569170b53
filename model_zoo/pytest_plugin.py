"""The pytest route of the model zoo: its configurations as parametrized tests.

    pytest model_zoo --target neuron -n 2 --junitxml out.xml [--family F] [--filter GLOB]
                     [--exclude-models GLOB] [--sample N --seed S | --base]

The selection means what it means for ``neuron-conformance models``: every
configuration of the selection, a stratified ``--sample``, or one ``--base``
configuration per architecture. Target options, pool and verdicts come from
``runner.pytest_plugin``.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["runner.pytest_plugin"]

CONFIGS_KEY = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("neuron-validate-models", "model zoo")
    g.addoption("--family", default="", help="comma-separated families (timm, hf, diffusion, ...)")
    g.addoption("--filter", default="", help="comma-separated globs over architecture names")
    g.addoption("--exclude-models", default="", help="comma-separated globs to leave out")
    g.addoption("--sample", type=int, default=None, help="a stratified subset of N configurations")
    g.addoption("--seed", type=int, default=0, help="seed of --sample")
    g.addoption("--base", action="store_true", help="one base configuration per architecture")


def selected_configs(config: pytest.Config) -> list:
    """The configurations the options select; a bad selection is a usage error of the session."""
    import model_zoo

    from runner.pytest_plugin import split

    opt = config.getoption
    families = split(opt("--family")) or None
    patterns = split(opt("--filter")) or None
    exclude = split(opt("--exclude-models")) or None
    try:
        for f in families or ():
            if f not in model_zoo.registry.families():
                raise model_zoo.UnknownModelError(
                    f"unknown family {f!r} (families: {', '.join(sorted(model_zoo.registry.families()))})")
        for p in patterns or ():
            if not model_zoo.list_models([p]):
                model_zoo.get_entry(p)  # raises with the closest names
        if opt("--base") and opt("--sample") is not None:
            raise pytest.UsageError("--base and --sample are exclusive")
        if opt("--base"):
            configs = model_zoo.base_configs(families, patterns, exclude=exclude)
        elif opt("--sample") is not None:
            configs = model_zoo.sample_configs(opt("--sample"), opt("--seed"), families, patterns, exclude=exclude)
        else:
            configs = list(model_zoo.enumerate_configs(families, patterns, exclude=exclude))
    except model_zoo.ModelZooError as exc:
        raise pytest.UsageError(str(exc)) from None
    return configs


def pytest_configure(config: pytest.Config) -> None:
    """Selects the configurations up front, so a bad selection is a usage error (exit 4) with one line."""
    config.stash[CONFIGS_KEY] = selected_configs(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_case" not in metafunc.fixturenames:
        return
    from model_zoo.execute import model_case

    cases = [model_case(c) for c in metafunc.config.stash[CONFIGS_KEY]]
    metafunc.parametrize("model_case", cases, ids=[c.title.removeprefix("model:") for c in cases])


@pytest.fixture(scope="session")
def model_runner(pytestconfig):
    from runner.pytest_plugin import open_runner, settings

    pool = open_runner(settings(pytestconfig, "models", timeout_s=600.0))
    yield pool
    pool.close()
