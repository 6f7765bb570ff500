"""Predicted against measured: each recipe's gain as the profile's advice estimated it and
as its A/B measured it, side by side in the ``optimize_recipes`` table.

An advice rule estimates what acting on it saves, as a percent of the profiled step
(``Advice.estimated_gain_pct``); a recipe names the rules it acts on (``advice_rules``).
The measured gain is the step time the recipe saved in its own A/B, as a percent of the
step before it: ``100 (1 - 1/speedup)`` at the paired rounds' speedup, so that it lies in its
interval (``measured_gain_ci``: the same at the speedup interval's bounds); where the A/B
formed no interval, ``100 (before - after) / before`` of the medians. Both are "percent of
the step", so they compare directly; the estimate comes from a profile of the stock step,
the measurement from a step that already has the recipes accepted before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .intervals import gain_pct, measured_gain_ci
from .recipes import load_recipes

if TYPE_CHECKING:
    from ..analysis.rulebook import Advice
    from .results import RecipeResult


def measured_gain_pct(before_ms: float | None, after_ms: float | None) -> float | None:
    """Step time saved, as a percent of the step before (None without both figures)."""
    if not before_ms or after_ms is None or before_ms <= 0:
        return None
    return 100.0 * (before_ms - after_ms) / before_ms


def profile_advice(profile: "Path | str | Any") -> list["Advice"]:
    """The advice on a profile Run (a Run or its path): what ``profilednn report`` says."""
    from ..analysis.api import advise

    return advise(profile)


def fill_gains(recipes: Sequence["RecipeResult"], advice: Sequence["Advice"] | None = None) -> None:
    """Set ``measured_gain_pct`` on every recipe that was timed (at its paired speedup where
    its A/B has an interval, else from the medians) and ``estimated_gain_pct`` on every
    recipe one of whose advice rules fired (the largest estimate among them)."""
    by_rule: dict[str, float] = {}
    for item in advice or ():
        by_rule[item.rule] = max(by_rule.get(item.rule, float("-inf")), float(item.estimated_gain_pct))
    known = load_recipes()
    for r in recipes:
        speedup = r.speedup if r.speedup_ci is not None else None
        r.measured_gain_pct = (gain_pct(speedup) if speedup is not None and speedup > 0
                               else measured_gain_pct(r.before_ms, r.after_ms))
        recipe = known.get(r.recipe)
        rules = recipe.advice_rules if recipe is not None else ()
        hits = [by_rule[rule] for rule in rules if rule in by_rule]
        r.estimated_gain_pct = max(hits) if hits else None


__all__ = ["fill_gains", "measured_gain_ci", "measured_gain_pct", "profile_advice"]
