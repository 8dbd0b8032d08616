# SPDX-License-Identifier: GPL-2.0-or-later
"""The tree's shape, checked where import-linter cannot: no import cycle between
modules (imports inside functions count) but the REPL's command registry, whose
modules register themselves with the registry that imports them all; and every
package says in its docstring what it holds."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
# the registry imports its commands, each command registers itself with it
REGISTRY = "madtrace.live.registry"
COMMANDS = "madtrace.live.commands"


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one module."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def module_graph() -> dict[str, set[str]]:
    g = grimp.build_graph("madtrace", exclude_type_checking_imports=True)
    return {m: {i for i in g.find_modules_directly_imported_by(m) if i.startswith("madtrace")}
            for m in g.modules if m.startswith("madtrace")}


def test_no_import_cycle_but_the_command_registry():
    cycles = [c for c in strongly_connected(module_graph())
              if not all(m == REGISTRY or m == COMMANDS or m.startswith(COMMANDS + ".") for m in c)]
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]


def test_every_package_says_what_it_holds():
    bare = []
    for init in sorted((ROOT / "madtrace").rglob("__init__.py")):
        if "__pycache__" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        if not doc or len(doc.split()) < 6:
            bare.append(str(init.relative_to(ROOT)))
    assert not bare, f"packages without a docstring that says what they hold: {bare}"


def test_no_constructor_takes_more_than_ten_parameters():
    """A class that needs more is doing several things: its collaborators, or a
    dataclass of choices, say which (data/engine.py DataChoices)."""
    wide = []
    for path in sorted((ROOT / "madtrace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    count = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs) + \
                        bool(a.vararg) + bool(a.kwarg)
                    if count > 10:
                        wide.append(f"{path.relative_to(ROOT)}: {node.name} ({count})")
    assert not wide, f"constructors over 10 parameters: {wide}"
