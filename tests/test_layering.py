"""The layout's one rule: packages import downward only, and no two files import each other in a circle.

Every import counts: at module level, inside a function, and through
``importlib.import_module("pkg.mod")`` / ``__import__`` with a literal name,
as well as ``"pkg.mod:attr"`` strings (the form this project hands to a
loader). The layers, from the bottom up, are the map in the README's
"Layout" section; packages on one layer may not import each other.
"""

from __future__ import annotations

import ast
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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            files[_module_name(path)] = path
    return files


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(module: str, path: Path, known: frozenset[str] = frozenset()) -> set[str]:
    """Every project module name that ``module`` refers to, however it imports it.

    ``known`` holds the project's module names. A string constant counts when it reads ``pkg.mod:attr``
    or names a module of ``known`` (what importlib would be handed); a file name like "results.sqlite" does not.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
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
            if match and match.group(1).split(".")[0] in PACKAGES and (":" in node.value or
                                                                    (node.value in known and "." in node.value)):
                found.add(match.group(1))
    return {name for name in found if name.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    files = project_files()
    graph: dict[str, set[str]] = {}
    known = frozenset(files)
    for module, path in files.items():
        edges = set()
        for name in imports_of(module, path, known):
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


def test_no_file_imports_itself_in_a_circle():
    cycles = _cycles(import_graph())
    assert not cycles, "files in an import cycle:\n" + "\n".join(" <-> ".join(c) for c in cycles)


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
])
def test_the_check_sees_every_kind_of_import(tmp_path, source, expected):
    path = tmp_path / "results" / "x.py"
    path.parent.mkdir()
    path.write_text(source)
    assert imports_of("results.x", path, frozenset({"report.dashboard", "results.store"})) == expected
