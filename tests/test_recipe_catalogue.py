"""The recipe catalogue (``profilednn/recipe_catalogue.py``): one line per recipe, in the
order optimize tries them, torch-free, and the one place besides its own module where a
recipe's name is spelled."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from importlib import import_module
from pathlib import Path

from test_import_graph import docstring_nodes

from profilednn import recipe_catalogue as catalogue
from profilednn.optimization import list_recipes
from profilednn.optimization.script.checks import EDIT_ORDER

SRC = Path(__file__).resolve().parents[1] / "src" / "profilednn"
# Ordinary words and keys with other meanings too (a `threads` column, a workload's
# `channels_last` knob, the fingerprint's `allocator`): not counted.
GENERIC = {catalogue.THREADS, catalogue.ALLOCATOR, catalogue.CHANNELS_LAST}


def _identifiers(tree: ast.AST) -> set[int]:
    """String constants that name Python objects, not recipes: docstrings, ``__all__``
    entries and the keys of a lazy export table (``lazy_getattr(__name__, {...})``)."""
    skipped = docstring_nodes(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skipped.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.Dict) and node.values and all(
                isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith(".")
                for v in node.values):
            skipped.update(id(k) for k in node.keys if k is not None)
    return skipped


def spelled_in() -> dict[str, set[str]]:
    """Each recipe name -> the modules of src/ that spell it as a string literal."""
    names = set(catalogue.recipe_names())
    where: dict[str, set[str]] = defaultdict(set)
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _identifiers(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped:
                where[node.value].add(str(path.relative_to(SRC)))
    return where


def test_each_recipe_name_is_spelled_in_its_own_module_and_the_catalogue_only() -> None:
    where = spelled_in()
    for line in catalogue.CATALOGUE:
        if line.name in GENERIC:
            continue
        own = line.module.replace(".", "/") + ".py"
        assert where[line.name] <= {"recipe_catalogue.py", own}, (line.name, sorted(where[line.name]))


def test_the_catalogue_order_is_optimizes_order() -> None:
    assert [r.name for r in list_recipes()] == catalogue.recipe_names()
    assert catalogue.INJECTABLE == tuple(n for n in catalogue.recipe_names() if catalogue.entry(n).injectable)
    assert EDIT_ORDER == catalogue.INJECTION_ORDER and set(EDIT_ORDER) == set(catalogue.INJECTABLE)


def test_every_line_names_the_module_that_defines_the_recipe() -> None:
    for line, recipe in zip(catalogue.CATALOGUE, list_recipes()):
        module = import_module(line.import_path)
        assert module.RECIPE is recipe and type(recipe).__module__ == line.import_path
        assert recipe.gate_kind == line.gate, line.name
        assert recipe.fresh_process == line.process_start, line.name
        assert (recipe.injection() is not None) == line.injectable, line.name


def test_every_advice_rule_of_a_recipe_exists_and_leads_to_one_recipe() -> None:
    from profilednn.analysis.rules import RULES

    rules = [rule for line in catalogue.CATALOGUE for rule in line.advice_rules]
    assert len(rules) == len(set(rules)) and set(rules) <= set(RULES)


def test_the_catalogue_imports_no_torch() -> None:
    code = "import profilednn.recipe_catalogue, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
