"""The gate's hooks: reporters are plugins, as in pytest.

The gate computes; it never prints or writes files itself. Whatever reports
it (the terminal lines, JUnit XML, a CI system's annotations) is a plugin
object implementing any of the hooks below by name. As with pluggy, a method
that looks like a hook but is not one is an error, not silently ignored: a
misspelt hook would otherwise never run.

    gate_start(report)                      comparison done, reruns about to start
    gate_rerun(change, attempt, outcome)    one rerun in a fresh process finished
    gate_finish(report)                     verdicts final
"""

from __future__ import annotations

import difflib
from typing import Iterable

HOOKS = ("gate_start", "gate_rerun", "gate_finish")
PREFIX = "gate_"


class Hooks:
    def __init__(self, plugins: Iterable[object] = ()) -> None:
        self.plugins: list[object] = []
        for plugin in plugins:
            self.register(plugin)

    def register(self, plugin: object) -> None:
        for attr in dir(plugin):
            if attr.startswith(PREFIX) and attr not in HOOKS and callable(getattr(plugin, attr)):
                close = difflib.get_close_matches(attr, HOOKS, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise TypeError(f"{type(plugin).__name__}.{attr}: no such gate hook{hint} (hooks: {', '.join(HOOKS)})")
        self.plugins.append(plugin)

    def call(self, hook: str, **kwargs) -> None:
        if hook not in HOOKS:
            raise ValueError(f"hook={hook!r} (type=str): not a gate hook (hooks: {', '.join(HOOKS)})")
        for plugin in self.plugins:
            method = getattr(plugin, hook, None)
            if method is not None:
                method(**kwargs)
