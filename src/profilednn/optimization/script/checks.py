"""Which recipe applies to a script, from what its stock arm saw (``facts.py``), and the
code edit that does by hand what an accepted recipe injects: a dispatcher over the recipes.

The built-in recipes answer ``check(setup, ctx)`` on a ``TrainStep``; a script has no
setup, only the objects the stock arm met, so each recipe also answers
``script_check(facts, ctx, accepted)`` (in its own module) with the built-in answer on
those objects: the same reasons where the same facts decide (BF16 on a CPU without native
BF16, an optimizer already fused), and a recipe the script already uses (its own autocast,
``fused=True``, ``torch.compile``) is skipped with that reason. The process-level recipes
(threads, allocator) answer ``launch_check``: they only read the launch environment.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ...recipe_catalogue import INJECTABLE, INJECTION_ORDER
from ..recipe_contract import Context, Recipe
from ..recipes import load_recipes
from .facts import ScriptFacts

# The order the edits are made in, the injector's (the catalogue's injection order).
EDIT_ORDER = INJECTION_ORDER


def script_check(recipe: Recipe, facts: ScriptFacts, ctx: Context, env: dict[str, str],
                 accepted: Collection[str] = ()) -> str | None:
    """Why ``recipe`` does not apply to the script (None: it does). ``env``: the launch
    environment accepted so far; ``accepted``: the injected recipes accepted so far."""
    if recipe.fresh_process:
        return recipe.launch_check(ctx, dict(env))
    reason = recipe.script_check(facts, ctx, accepted)
    if reason is None and recipe.name not in INJECTABLE:
        return Recipe.script_check(recipe, facts, ctx, accepted)  # no injection is known for it
    return reason


def code_edit(recipe: str, facts: ScriptFacts) -> str | None:
    """The edit to the script that does what the accepted ``recipe`` injects (None for the
    process-level recipes: their edit is the launch prefix)."""
    known = load_recipes().get(recipe)
    return known.code_edit(facts) if known is not None else None


def code_edits(recipes: Iterable[str], facts: ScriptFacts) -> list[str]:
    """The edits for the accepted ``recipes``, in the order they are to be made (``EDIT_ORDER``),
    whatever order the search accepted them in."""
    ordered = sorted(recipes, key=lambda r: EDIT_ORDER.index(r) if r in EDIT_ORDER else len(EDIT_ORDER))
    return [e for e in (code_edit(r, facts) for r in ordered) if e]


__all__ = ["EDIT_ORDER", "code_edit", "code_edits", "script_check"]
