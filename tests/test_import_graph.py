"""The package's import graph, read from the source with ``ast`` (nothing is imported):
no cycle between modules, counting imports inside functions, and no private name
(``_x``) imported from another package.

Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "profilednn"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _package_of(module: str) -> str:
    """The package a module lives in (a package's ``__init__`` is its own package)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _absolute(module: str, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    base = _package_of(module).split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package modules it imports, anywhere in it), and the cross-package
    private imports as ``"importer: module.name"``."""
    edges: dict[str, set[str]] = {}
    private: list[str] = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skipped = _type_checking_nodes(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node.level, node.module)
                if base.split(".")[0] != PACKAGE:
                    continue
                for alias in node.names:
                    if f"{base}.{alias.name}" in MODULES:
                        targets.add(f"{base}.{alias.name}")
                        continue
                    targets.add(base)
                    private_name = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private_name and base in MODULES and _package_of(base) != _package_of(module):
                        private.append(f"{module}: {base}.{alias.name}")
        # Importing a.b.c runs a/__init__ and a/b/__init__ first, unless the importer is in them.
        for target in list(targets):
            parts = target.split(".")
            for i in range(1, len(parts)):
                ancestor = ".".join(parts[:i])
                if not (module == ancestor or module.startswith(ancestor + ".")):
                    targets.add(ancestor)
        edges[module] = {t for t in targets if t in MODULES and t != module}
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_sees_every_module_and_function_level_imports() -> None:
    edges, _ = import_graph()
    assert len(MODULES) > 100
    # A function-level import (advice's topology lookup) is an edge like any other.
    assert "profilednn.topology" in edges["profilednn.analysis.rulebook"]


def test_importing_a_submodule_counts_as_importing_its_packages() -> None:
    edges, _ = import_graph()
    # tables.py imports verbose.schema, which runs verbose/__init__ first.
    assert "profilednn.verbose" in edges["profilednn.tables"]
    # A module never "imports" the package it is part of.
    assert "profilednn.verbose" not in edges["profilednn.verbose.reader"]


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    edges, _ = import_graph()
    found = cycles(edges)
    if found:
        pytest.fail("import cycles (break each by moving the shared part into a module both import):\n"
                    + "\n".join(" <-> ".join(c) for c in found))


def test_no_private_name_imported_from_another_package() -> None:
    _, private = import_graph()
    assert not private, "private names imported across packages (make them public or move them):\n" + "\n".join(private)
