"""Reporters are plugins on hooks, as in pytest, with pytest's own plugin library (pluggy).

What computes (the suite runner, the gate) never prints or writes files
itself; it calls hooks, and whatever reports (progress lines, the results
store, JSON lines, JUnit XML, a CI system's annotations) is a plugin object
that implements some of them by name. As with pytest, a method whose name
starts with a hook prefix but matches no hook is an error, with the closest
hook named, not silently ignored: a misspelt hook would otherwise never run.

A caller declares its hooks in a spec class (methods decorated with
:data:`hookspec`), then calls them on the manager with keyword arguments::

    hooks = make_hooks(SuiteHooks, prefixes=("suite_", "case_"), plugins=[StoreWriter(store)])
    hooks.hook.case_outcome(case=case, outcome=outcome)
"""

from __future__ import annotations

import difflib
from typing import Iterable

import pluggy

PROJECT = "neuron_validate"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

_PLAIN_IMPL = {"wrapper": False, "hookwrapper": False, "optionalhook": False, "tryfirst": False, "trylast": False,
               "specname": None}


class HookError(TypeError):
    """A plugin implements something that is not a hook (usually a misspelt one)."""


class Hooks(pluggy.PluginManager):
    """A pluggy manager that takes plain methods named after hooks, like pytest's ``pytest_*`` ones."""

    def __init__(self, spec: type, *, prefixes: tuple[str, ...], plugins: Iterable[object] = ()) -> None:
        super().__init__(PROJECT)
        self.prefixes = prefixes
        self.add_hookspecs(spec)
        self.names = tuple(sorted(n for n in dir(spec) if n.startswith(prefixes)))
        for plugin in plugins:
            self.register(plugin)

    def parse_hookimpl_opts(self, plugin, name: str):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith(self.prefixes) and callable(getattr(plugin, name, None)):
            return dict(_PLAIN_IMPL)
        return opts

    def register(self, plugin: object, name: str | None = None):
        for attr in dir(plugin):
            if attr.startswith(self.prefixes) and attr not in self.names and callable(getattr(plugin, attr)):
                close = difflib.get_close_matches(attr, self.names, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise HookError(f"{type(plugin).__name__}.{attr}: no such {self.prefixes[0].rstrip('_')} hook{hint} "
                                f"(hooks: {', '.join(self.names)})")
        return super().register(plugin, name)

    def call(self, hook: str, **kwargs) -> list:
        """Calls every plugin's ``hook`` with these keyword arguments; the results of those that returned one."""
        if hook not in self.names:
            raise ValueError(f"hook={hook!r} (type=str): not a hook here (hooks: {', '.join(self.names)})")
        return getattr(self.hook, hook)(**kwargs)


__all__ = ["HookError", "Hooks", "hookimpl", "hookspec"]
