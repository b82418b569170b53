"""Every selected model-zoo configuration, on the target against the reference."""

from runner.pytest_plugin import check_outcome


def test_model(model_case, model_runner):
    check_outcome(model_runner.run_one(model_case))
