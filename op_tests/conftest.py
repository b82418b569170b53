"""Makes ``pytest op_tests`` the operator suite (see op_tests/pytest_plugin.py)."""

pytest_plugins = ["op_tests.pytest_plugin"]
