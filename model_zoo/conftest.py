"""Makes ``pytest model_zoo`` the model-zoo suite (see model_zoo/pytest_plugin.py)."""

pytest_plugins = ["model_zoo.pytest_plugin"]
