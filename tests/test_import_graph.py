"""The package's import graph, read from the source with ``ast`` (nothing is imported):
no cycle between modules, no package importing a package ranked above it (``LAYERS``, the
ranking docs/architecture.md writes down), and no private name (``_x``) imported from
another package.

An edge is an ``import`` anywhere in a module (inside functions too), a string that names a
package module (``importlib.import_module("profilednn.x")``, a job list), each entry of
a lazy export table (``lazy_getattr``: ``".machine"`` relative to the module's package) and
each module the recipe catalogue names, from the loader that imports it
(``optimization/recipes.py``; the catalogue is data, read here with ``ast``).
Imports under ``if TYPE_CHECKING:`` count like any other, for every check (cycles, the
ranking, private names): they never run, but a reader and a type checker follow them, and a
cycle through them is a tangle all the same (the rules once took the facade that lists them).
Left out: a name read from one's own ancestor package that the ancestor defines eagerly
(``from .. import __version__``: Python ran that ``__init__`` before the importer).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "profilednn"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}

# The package ranking, lowest first (docs/architecture.md, "The layers"). A unit is a
# subpackage of profilednn or one of its top-level modules ("profilednn" is the root
# __init__). A module imports only from its own unit or from units in a lower tier; units
# in the same tier do not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_lazy", "errors", "atomic", "formatting", "interrupts", "cache", "vocabulary", "option_fields", "progress"),
    ("topology", "extras", "builtin_workloads", "recipe_catalogue", "step_summary"),
    ("outputs",),
    ("kernels",),
    ("verbose",),
    ("tables",),
    ("run", "train_step"),
    ("hardware", "render"),
    ("workloads",),
    ("capture",),
    ("projection",),
    ("analysis",),
    ("optimization",),
    ("distributed",),
    ("memory",),
    ("report",),
    ("cli", "optim"),
    ("profilednn", "__main__"),
)
RANK: dict[str, int] = {unit: tier for tier, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The ranked unit a module belongs to: ``profilednn.projection.machine`` -> ``projection``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _package_of(module: str) -> str:
    """The package a module lives in (a package's ``__init__`` is its own package)."""
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _eager_names(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level (assignments, defs, classes, imports)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in stmt.names)
    return names


_DOTTED = re.compile(r"^\.?[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module and its classes and functions."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _string_targets(module: str, tree: ast.AST) -> set[str]:
    """Package modules named by string literals: absolute dotted names (their longest
    module prefix, so ``"profilednn.kernels.FusedLAMB"`` counts as ``profilednn.kernels``)
    and, in a module with a lazy export table, relative ones (``".machine"``)."""
    lazy = any(isinstance(n, ast.Name) and n.id == "lazy_getattr" for n in ast.walk(tree))
    docs = docstring_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
            continue
        text = node.value
        if not _DOTTED.match(text):
            continue
        if text.startswith("."):
            if not lazy:
                continue
            text = _absolute(module, 1, text[1:])
        elif text.split(".")[0] != PACKAGE:
            continue
        parts = text.split(".")
        for cut in range(len(parts), 1, -1):
            if ".".join(parts[:cut]) in MODULES:
                found.add(".".join(parts[:cut]))
                break
    return found


CATALOGUE = "profilednn.recipe_catalogue"
CATALOGUE_LOADER = "profilednn.optimization.recipes"


def catalogue_modules(tree: ast.AST) -> set[str]:
    """The modules the recipe catalogue names: the second argument of each ``RecipeEntry(...)``
    (dotted, relative to ``profilednn``)."""
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "RecipeEntry"
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            found.add(f"{PACKAGE}.{node.args[1].value}")
    return found


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
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for m, p in MODULES.items()}
    eager = {m: _eager_names(t) for m, t in trees.items()}
    for module, tree in trees.items():
        edges[module] = module_imports(module, tree, eager, private)
        if module == CATALOGUE_LOADER:  # the loader imports each module the catalogue names
            named = catalogue_modules(trees[CATALOGUE])
            named |= {".".join(t.split(".")[:i]) for t in named for i in range(2, len(t.split(".")))}
            edges[module] |= {t for t in named if t in MODULES and t != module
                              and not module.startswith(t + ".")}
    return edges, private


def module_imports(module: str, tree: ast.AST, eager: dict[str, set[str]], private: list[str]) -> set[str]:
    """The package modules ``module`` (parsed as ``tree``) imports, ``TYPE_CHECKING`` blocks
    included; appends its cross-package private imports to ``private``. ``eager``: the names
    each module binds at its top level."""
    targets: set[str] = _string_targets(module, tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module)
            if base.split(".")[0] != PACKAGE:
                continue
            own_ancestor = module.startswith(base + ".")
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    targets.add(f"{base}.{alias.name}")
                    continue
                if own_ancestor and alias.name in eager.get(base, ()):
                    continue  # already bound: the ancestor ran before the importer
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
    return {t for t in targets if t in MODULES and t != module}


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


def test_the_recipe_loader_imports_each_module_the_catalogue_names() -> None:
    edges, _ = import_graph()
    assert {"profilednn.optimization.loss", "profilednn.optimization.threads"} <= edges[CATALOGUE_LOADER]
    assert not edges[CATALOGUE] & catalogue_modules(ast.parse(MODULES[CATALOGUE].read_text(encoding="utf-8")))


def test_importing_a_submodule_counts_as_importing_its_packages() -> None:
    edges, _ = import_graph()
    # tables.py imports verbose.schema, which runs verbose/__init__ first.
    assert "profilednn.verbose" in edges["profilednn.tables"]
    # A module never "imports" the package it is part of.
    assert "profilednn.verbose" not in edges["profilednn.verbose.reader"]


def test_strings_and_lazy_tables_are_edges() -> None:
    edges, _ = import_graph()
    # report/job_sections.py names each job's report module in a string for importlib.
    assert "profilednn.memory.report" in edges["profilednn.report.job_sections"]
    # A lazy export table: absolute ("profilednn.run") and relative (".budget") entries.
    assert "profilednn.run" in edges["profilednn"]
    assert "profilednn.memory.budget" in edges["profilednn.memory.api"]
    # An eager name read from one's ancestor package is no edge; a lazy one is.
    assert "profilednn" not in edges["profilednn.cli.app"]


def test_type_checking_imports_are_edges() -> None:
    # Never run, but followed by readers and type checkers: a cycle through them counts.
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .facade import Analysis\n")
    assert "profilednn.analysis.facade" in module_imports("profilednn.analysis.rules", tree, {}, [])
    private: list[str] = []
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..run import _Private\n")
    module_imports("profilednn.analysis.rules", tree, {}, private)
    assert private == ["profilednn.analysis.rules: profilednn.run._Private"]


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every edge whose target's unit is not ranked below the importer's (its own unit aside)."""
    found = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b and RANK[b] >= RANK[a]:
                found.append(f"{module} -> {target}   ({a}: tier {RANK[a]}, {b}: tier {RANK[b]})")
    return found


def test_the_ranking_names_every_unit_once() -> None:
    units = [u for tier in LAYERS for u in tier]
    assert len(units) == len(set(units))
    assert {unit_of(m) for m in MODULES} <= set(units), "rank the new unit in LAYERS (and in docs/architecture.md)"


def test_the_ranking_check_flags_upward_and_sideways_imports() -> None:
    assert upward_imports({"profilednn.run": {"profilednn.tables"}}) == []
    assert upward_imports({"profilednn.tables": {"profilednn.run"}})
    assert upward_imports({"profilednn.hardware.machine": {"profilednn.render.html"}})  # same tier


def test_no_package_imports_upward() -> None:
    edges, _ = import_graph()
    found = upward_imports(edges)
    if found:
        pytest.fail("imports against the package ranking (LAYERS; docs/architecture.md) -- move the shared part "
                    "down into a unit both may import:\n" + "\n".join(found))


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_between_modules() -> None:
    edges, _ = import_graph()
    found = cycles(edges)
    if found:
        pytest.fail("import cycles (break each by moving the shared part into a module both import):\n"
                    + "\n".join(" <-> ".join(c) for c in found))


def test_only_the_analysis_exports_import_its_facade() -> None:
    # Advice rules and the comparison read a Run through analysis/view.py, not the facade that lists them.
    edges, _ = import_graph()
    assert sorted(m for m, t in edges.items() if "profilednn.analysis.facade" in t and unit_of(m) == "analysis") == [
        "profilednn.analysis"]


def test_no_private_name_imported_from_another_package() -> None:
    _, private = import_graph()
    assert not private, "private names imported across packages (make them public or move them):\n" + "\n".join(private)
