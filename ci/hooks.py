"""The gate's hooks: reporters are plugins, as in pytest (conformance.plugins, on pluggy).

The gate computes; it never prints or writes files itself. Whatever reports
it (the terminal lines, JUnit XML, a CI system's annotations) is a plugin
object implementing any of the hooks below by name. A method that looks like
a hook but is not one is an error, not silently ignored: a misspelt hook
would otherwise never run.

    gate_start(report)                      comparison done, reruns about to start
    gate_rerun(change, attempt, outcome)    one rerun in a fresh process finished
    gate_finish(report)                     verdicts final
"""

from __future__ import annotations

from typing import Iterable

from conformance.plugins import Hooks as _Hooks
from conformance.plugins import hookspec


class GateHooks:
    @hookspec
    def gate_start(self, report):
        """The comparison with the baseline is done; reruns are about to start."""

    @hookspec
    def gate_rerun(self, change, attempt, outcome):
        """One rerun of a regressed case, in a fresh process, finished."""

    @hookspec
    def gate_finish(self, report):
        """The verdicts are final."""


HOOKS = ("gate_start", "gate_rerun", "gate_finish")


def Hooks(plugins: Iterable[object] = ()) -> _Hooks:  # noqa: N802 - reads as the class it makes
    """The gate's plugin manager with ``plugins`` registered."""
    return _Hooks(GateHooks, prefixes=("gate_",), plugins=plugins)
