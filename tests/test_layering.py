"""The layout's one rule: packages import downward only, and no two files import each other in a circle.

Every import counts: at module level, inside a function, and through
``importlib.import_module`` / ``__import__``, as well as ``"pkg.mod:attr"``
strings (the form this project hands to a loader). A name built at run time
is worked out as far as the source allows (``f"{__package__}.{m}"`` with ``m``
looping over a tuple the module lists, ``"pkg." + name``, ``path.stem`` of a
``glob("commands_*.py")`` over the module's folder); a part that cannot be
worked out stands for any module there (``pkg.*``), so a loader hidden behind a
computed name still shows its edges. Names that come wholly from outside (a
user's ``--backend-module``, an entry point) are not the project's imports.
The layers, from the bottom up, are the map in the README's "Layout" section;
packages on one layer may not import each other.
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. A package may import its own layer's modules only from itself, and anything below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("emulator",),
    ("conformance",),
    ("diff",),
    ("results",),
    ("runner",),
    ("op_tests", "model_zoo"),
    ("distributed",),
    ("validate",),
    ("ci",),
    ("report",),
    ("cli",),
)
PACKAGES = {p: i for i, layer in enumerate(LAYERS) for p in layer}
LOADER_STRING = re.compile(r"^([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(?::[A-Za-z_]\w*)?$")


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    files = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            files[_module_name(path, root)] = path
    return files


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(module: str, path: Path, known: frozenset[str] = frozenset(), packages=PACKAGES) -> set[str]:
    """Every project module name that ``module`` refers to, however it imports it.

    ``known`` holds the project's module names. A string constant counts when it reads ``pkg.mod:attr``
    or names a module of ``known`` (what importlib would be handed); a file name like "results.sqlite" does not.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set(_dynamic_imports(tree, module, is_package, known, packages))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = _resolve_relative(module, is_package, node.level, node.module)
            for alias in node.names:
                # `from pkg import submodule` depends on the submodule (a package's __init__ is imported first
                # for any of its modules anyway); `from pkg import name` on the package.
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = LOADER_STRING.match(node.value)
            if match and match.group(1).split(".")[0] in packages and (":" in node.value or
                                                                    (node.value in known and "." in node.value)):
                found.add(match.group(1))
    return {name for name in found if name.split(".")[0] in packages}


# What a name built at run time is worked out to: "*" stands for a part the source does not pin down.
ANY = "*"
MAX_NAMES = 256  # more candidate names than this: give up on the expression (ANY)


def _bindings(tree: ast.Module) -> dict[str, list[tuple[str, ast.expr]]]:
    """Every expression each name is bound to anywhere in the module, scopes ignored (a safe over-estimate).

    ``("is", e)``: ``name = e``; ``("each", e)``: ``for name in e`` (loops and comprehensions alike).
    """
    bound: dict[str, list[tuple[str, ast.expr]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(("is", node.value))
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            bound.setdefault(node.target.id, []).append(("each", node.iter))
    return bound


class _Names:
    """The strings an expression of one module may evaluate to, as far as its source tells."""

    def __init__(self, tree: ast.Module, module: str, is_package: bool) -> None:
        self.bound = _bindings(tree)
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.seen: set[str] = set()  # names being worked out: `x = x + "a"` must not recurse forever

    def strings(self, node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name):
            if node.id == "__package__":
                return {self.package}
            if node.id == "__name__":
                return {self.module}
            return self._union(node.id, lambda how, e: self.strings(e) if how == "is" else self.elements(e))
        if isinstance(node, ast.JoinedStr):
            return self._concat(self.strings(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._concat([self.strings(node.left), self.strings(node.right)])
        if isinstance(node, ast.Attribute) and node.attr == "stem" and isinstance(node.value, ast.Name):
            # `for path in folder.glob("commands_*.py"): ... path.stem`
            return self._union(node.value.id, lambda how, e: self._glob_stems(e) if how == "each" else {ANY})
        return {ANY}

    def elements(self, node: ast.expr) -> set[str]:
        """What iterating over ``node`` may yield."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.strings(e) for e in node.elts)) if node.elts else set()
        if isinstance(node, ast.Name):
            return self._union(node.id, lambda how, e: self.elements(e) if how == "is" else {ANY})
        return {ANY}

    def _union(self, name: str, of) -> set[str]:
        if name not in self.bound or name in self.seen:
            return {ANY}
        self.seen.add(name)
        try:
            return set().union(*(of(how, e) for how, e in self.bound[name]))
        finally:
            self.seen.discard(name)

    @staticmethod
    def _glob_stems(node: ast.expr) -> set[str]:
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("glob", "rglob")
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            return {node.args[0].value.removesuffix(".py")}
        return {ANY}

    @staticmethod
    def _concat(parts) -> set[str]:
        out = {""}
        for options in parts:
            out = {a + b for a, b in itertools.product(out, options)}
            if len(out) > MAX_NAMES:
                return {ANY}
        return out


def _dynamic_imports(tree: ast.Module, module: str, is_package: bool, known: frozenset[str], packages) -> set[str]:
    """The project modules that ``import_module(...)`` / ``__import__(...)`` calls with a computed name may load."""
    names = _Names(tree, module, is_package)
    found: set[str] = set()
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if called not in ("import_module", "__import__") or not node.args:
            continue
        for name in names.strings(node.args[0]):
            if name.startswith("."):  # import_module(".x", __package__)
                dots = len(name) - len(name.lstrip("."))
                name = _resolve_relative(module, is_package, dots, name[dots:] or None)
            top = name.split(".")[0]
            if top not in packages:
                continue  # a name from outside (ANY on its own, a user's module): not the project's import
            found.update(fnmatch.filter(known, name) if ANY in name else [name])
    return found


def import_graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    files = project_files(root, packages)
    graph: dict[str, set[str]] = {}
    known = frozenset(files)
    for module, path in files.items():
        edges = set()
        for name in imports_of(module, path, known, packages):
            # `from pkg import name`: the module pkg.name where it exists, else pkg itself.
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.add(name)
        graph[module] = edges
    return graph


def test_packages_import_downward_only():
    problems = []
    for module, edges in import_graph().items():
        own = module.split(".")[0]
        for other in sorted(edges):
            theirs = other.split(".")[0]
            if theirs == own:
                continue
            if PACKAGES[theirs] >= PACKAGES[own]:
                problems.append(f"{module} -> {other} ({own} is on layer {PACKAGES[own]}, {theirs} on {PACKAGES[theirs]})")
    assert not problems, "imports against the layering:\n" + "\n".join(problems)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def assert_no_cycles(graph: dict[str, set[str]]) -> None:
    cycles = _cycles(graph)
    assert not cycles, "files in an import cycle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_file_imports_itself_in_a_circle():
    assert_no_cycles(import_graph())


def test_every_package_has_a_layer():
    top = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert top - {"tests"} == set(PACKAGES), "a top-level package without a layer (add it to LAYERS and the README)"


@pytest.mark.parametrize("source, expected", [
    ("def f():\n    import ci.gate\n", {"ci.gate"}),
    ("import importlib\nimportlib.import_module('report.dashboard')\n", {"report.dashboard"}),
    ("DB = 'results.sqlite'\n", set()),
    ("X = 'op_tests.execute:EXECUTOR'\n", {"op_tests.execute"}),
    ("from . import store\n", {"results.store"}),
    ("from . import STORE_NAME\n", {"results"}),
    # names built at run time
    ("import importlib\nfor m in ('store', 'x'):\n    importlib.import_module(f'{__package__}.{m}')\n",
     {"results.store", "results.x"}),
    ("NAMES = ['dashboard']\nmods = [__import__('report.' + n) for n in NAMES]\n", {"report.dashboard"}),
    ("import importlib\ndef load(name):\n    return importlib.import_module(f'results.{name}')\n",
     {"results.store", "results.x"}),  # not pinned down: any module of the package
    ("import importlib\nimportlib.import_module('.store', __package__)\n", {"results.store"}),
    ("import importlib\ndef load(name):\n    return importlib.import_module(name)\n", set()),  # a user's module
])
def test_the_check_sees_every_kind_of_import(tmp_path, source, expected):
    path = tmp_path / "results" / "x.py"
    path.parent.mkdir()
    path.write_text(source)
    assert imports_of("results.x", path, frozenset({"report.dashboard", "results.store", "results.x"})) == expected


LOADERS = {
    "a tuple the module lists": "COMMANDS = ('commands_a', 'commands_b')\n"
                                "def main():\n"
                                "    return [importlib.import_module(f'{__package__}.{m}') for m in COMMANDS]\n",
    "string concatenation": "def main():\n"
                            "    for m in ['commands_a', 'commands_b']:\n"
                            "        importlib.import_module(__package__ + '.' + m)\n",
    "a pattern over its folder": "from pathlib import Path\n"
                                 "def main():\n"
                                 "    for path in sorted(Path(__file__).parent.glob('commands_*.py')):\n"
                                 "        importlib.import_module(f'{__package__}.{path.stem}')\n",
    "a name it cannot pin down": "def load(name):\n"
                                 "    return importlib.import_module(f'{__package__}.{name}')\n",
}


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_a_cycle_through_a_computed_import_fails_the_check(tmp_path, loader):
    """cli/ had this shape: the entry point loaded its command modules by computed names, and they imported it back."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text("import importlib\n\nDEFAULT = 'runs'\n" + loader)
    (pkg / "commands_a.py").write_text("from .main import DEFAULT\n")  # module level: the back edge
    (pkg / "commands_b.py").write_text("")
    (pkg / "helpers.py").write_text("")
    graph = import_graph(tmp_path, ("pkg",))
    assert {"pkg.commands_a", "pkg.commands_b"} <= graph["pkg.main"]
    with pytest.raises(AssertionError, match="pkg.commands_a <-> pkg.main"):
        assert_no_cycles(graph)
    (pkg / "commands_a.py").write_text("from .helpers import *\n")  # the shared piece moved below both
    assert_no_cycles(import_graph(tmp_path, ("pkg",)))
