"""The search over recipes: each in turn, then a second pass.

Each recipe is checked against the current best setup, tried (``trial.py``) and, when
accepted, composed: the next recipe is measured against it. Then the in-process recipes
rejected for speed alone are tried once more where later recipes changed the arm: what
BF16 makes of the step decides again (FrozenBatchNorm's fp32 affine costs little in fp32
and, under BF16 autocast, promotes every frozen activation back to fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..train_step import TrainStep
from .gate import Arm
from .numerics import Trajectory
from .partial import OnResults
from .recipes import Recipe
from .results import RecipeResult
from .trial import Bench, try_in_children, try_in_process


@dataclass
class SearchState:
    """The recipes tried so far: accepted (in the recipes' order), the launch environment
    of the accepted process-level ones, one result per recipe, the warm setup with the
    accepted in-process recipes and its arm (what the next recipe would replace)."""

    accepted: list[Recipe]
    env: dict[str, str]
    results: list[RecipeResult]
    current: TrainStep
    arm: Arm
    changes: int = 0  # in-process recipes accepted so far: the arm's version

    def accept(self, recipe: Recipe, candidate: TrainStep, trajectory: Trajectory, order: dict[str, int]) -> None:
        self.accepted = sorted([*self.accepted, recipe], key=lambda r: order.get(r.name, len(order)))
        self.current = candidate  # warm, and exactly base + accepted recipes
        self.arm = Arm(trajectory, recipe.precision or self.arm.precision)
        self.changes += 1


def rejected_for_speed(result: RecipeResult) -> bool:
    """It applied and its numerics passed, but it was not fast enough: worth a second pass
    once later recipes changed the arm."""
    return result.applies and not result.accepted and result.numerics == "pass" and result.speedup is not None


def _try(recipe: Recipe, bench: Bench, state: SearchState) -> RecipeResult | None:
    """Try ``recipe`` against the state and fold it in; None when it does not apply."""
    bench.say(f"{recipe.name}: does it apply?")
    reason = recipe.check(state.current, bench.ctx)
    if reason is not None:
        state.results.append(RecipeResult(recipe.name, recipe.family, False, reason, decision=f"skipped: {reason}"))
        return None
    if recipe.fresh_process:
        result = try_in_children(recipe, bench, state.accepted, state.current, state.env, state.arm)
        if result.accepted:
            state.env.update(result.env)
        return result
    result, candidate, trajectory = try_in_process(recipe, bench, state.accepted, state.current, state.arm)
    if result.accepted and candidate is not None and trajectory is not None:
        state.accept(recipe, candidate, trajectory, bench.order)
    return result


def search(chosen: list[Recipe], bench: Bench, arm: Arm, on_results: OnResults | None = None) -> SearchState:
    """Each recipe in ``chosen`` in turn against the stock ``arm``, then the second pass;
    ``on_results`` hears every result so far each time one is decided."""
    state = SearchState([], {}, [], bench.base.clone(), arm)
    kept = on_results or (lambda results: None)
    tried_at: dict[int, int] = {}  # result index -> the arm's version it was tried against
    for recipe in chosen:
        version = state.changes
        result = _try(recipe, bench, state)
        if result is not None:
            if not recipe.fresh_process and rejected_for_speed(result):
                tried_at[len(state.results)] = version
            state.results.append(result)
        kept(state.results)
    _second_pass(chosen, bench, state, tried_at, kept)
    return state


def _second_pass(chosen: list[Recipe], bench: Bench, state: SearchState, tried_at: dict[int, int],
                 kept: OnResults) -> None:
    by_name, order = {r.name: r for r in chosen}, bench.order
    for index, version in tried_at.items():
        first = state.results[index]
        recipe = by_name[first.recipe]
        since = [r.name for r in state.accepted if order.get(r.name, 0) > order[recipe.name]]
        if state.changes == version or not since or recipe.check(state.current, bench.ctx) is not None:
            continue
        bench.say(f"{recipe.name}: second pass, after {', '.join(since)}")
        result, candidate, trajectory = try_in_process(recipe, bench, state.accepted, state.current, state.arm)
        result.decision += (f" (second pass, after {', '.join(since)}; first pass {first.speedup:.3f}x"
                            f" against {first.before_ms:.1f} ms)")
        if result.accepted and candidate is not None and trajectory is not None:
            state.accept(recipe, candidate, trajectory, order)
        state.results[index] = result
        kept(state.results)


__all__ = ["SearchState", "rejected_for_speed", "search"]
