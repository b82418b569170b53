"""Every selected OpInfo case, on the target against the reference."""

from runner.pytest_plugin import check_outcome


def test_op(op_case, op_runner):
    check_outcome(op_runner.run_one(op_case))
