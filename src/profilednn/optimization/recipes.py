"""The built-in recipes, in the order ``optimize`` tries them, and their selection by name.

A recipe is one change to a training setup that may make a step faster. Each says:

- ``check(setup, ctx)``: whether it applies (model, ISA, dtype, what is already done);
  ``None`` when it does, else the reason it does not, in one line;
- ``apply(setup, ctx)``: the change, made in place on a fresh clone; returns a one-line
  description of what was changed;
- ``tolerance``: how far its loss trajectory and gradients may drift from the stock
  setup's and still count as the same training (stated in the report);
- ``fresh_process``: whether it acts only at process start (LD_PRELOAD, OpenMP
  environment), so it must be measured in child processes.

The contract (``Recipe``, ``Tolerance``, ``Context``) lives in ``recipe_contract.py``. The
built-in recipes are listed, not registered by an import's side effect: each is the
``RECIPE`` of the module its line of ``recipe_catalogue.CATALOGUE`` names, loaded here into
``RECIPES`` in the catalogue's order; ``@register`` adds a recipe of one's own after them.
"""

from __future__ import annotations

from importlib import import_module

from ..errors import InputError
from ..recipe_catalogue import CATALOGUE, RecipeEntry
from .recipe_contract import BF16_TOLERANCE, FP32_TOLERANCE, RECIPES, Context, Recipe, Tolerance, register


def built_in(line: RecipeEntry) -> Recipe:
    """The recipe a catalogue line names: its module's ``RECIPE``."""
    recipe = import_module(line.import_path).RECIPE
    if not isinstance(recipe, Recipe) or recipe.name != line.name:
        raise TypeError(f"{line.import_path}.RECIPE is {recipe!r}, not the recipe {line.name}")
    return recipe


def _load_built_ins() -> None:
    for line in CATALOGUE:
        recipe = built_in(line)
        if RECIPES.setdefault(line.name, recipe) is not recipe:
            raise ValueError(f"recipe name missing or taken: {line.name!r}")


_load_built_ins()


def load_recipes() -> dict[str, Recipe]:
    """Every built-in recipe, in the order ``optimize`` tries them (the catalogue's), then
    the ones registered with ``@register``."""
    ordered = {line.name: RECIPES[line.name] for line in CATALOGUE if line.name in RECIPES}
    ordered.update({k: v for k, v in RECIPES.items() if k not in ordered})
    return ordered


def select_recipes(names: "list[str | Recipe] | str | None") -> list[Recipe]:
    """Recipes by name (a list, or ``"a,b,c"``) or as ``Recipe`` instances; all built-in
    ones for None. Named built-ins run in the registry's order whatever order they were
    given in (the order matters: torch.compile last, process settings after it); extra
    ``Recipe`` instances run after them, in the order given."""
    available = load_recipes()
    if names is None:
        return list(available.values())
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    if not names:
        raise InputError(f"no recipe named; choose from: {', '.join(available)}")
    wanted = [n for n in names if isinstance(n, str)]
    unknown = [n for n in wanted if n not in available]
    if unknown:
        raise InputError(f"unknown recipe(s) {', '.join(unknown)}; choose from: {', '.join(available)}")
    extra = [r for r in names if not isinstance(r, str)]
    bad = [r for r in extra if not isinstance(r, Recipe)]
    if bad:
        raise InputError(f"recipes must be names or Recipe instances, got {bad[0]!r}")
    return [r for n, r in available.items() if n in wanted] + list(dict.fromkeys(extra))


def list_recipes() -> list[Recipe]:
    """Every built-in recipe, in the order ``optimize`` tries them."""
    return list(load_recipes().values())


__all__ = [
    "BF16_TOLERANCE",
    "Context",
    "FP32_TOLERANCE",
    "RECIPES",
    "Recipe",
    "Tolerance",
    "built_in",
    "list_recipes",
    "load_recipes",
    "register",
    "select_recipes",
]
