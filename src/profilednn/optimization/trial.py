"""Try one recipe: build the candidate, judge its numerics, time it, decide.

An in-process recipe is built afresh on the caller's setup with the recipes accepted so far,
its seeded trajectory judged against the arm it would replace (``gate.py``), then timed
against the current best, interleaved. A process-level recipe (allocator, threads) runs
both arms in child processes (``child_ab.py``), with and without its environment.
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ProfileDNNError, first_line
from ..progress import Progress
from ..train_step import TrainStep
from .abtest import in_children, interleaved
from .child_ab import ChildSetupError, child_payload, children_ab, faults_note
from .gate import Arm, FreshSetups, gate_steps, judge
from .numerics import NumericsResult, Trajectory, record_trajectory
from .precision_gate import Calibration
from .recipes import Context, Recipe
from .results import RecipeResult
from .sequential import SequentialTest, round_line
from .settings import Settings

Calibrations = Callable[[str], Calibration]


@dataclass
class Bench:
    """What every trial shares: the caller's setup (never modified), the recipes' context,
    the settings, the stock setup's rounding noise and gate calibrations, progress, and
    the recipes' order (accepted recipes apply in it)."""

    base: TrainStep
    ctx: Context
    settings: Settings
    rounding: NumericsResult | None
    calibration: Calibrations
    say: Progress
    order: dict[str, int]


def build(base: TrainStep, recipes: list[Recipe], ctx: Context) -> TrainStep:
    """A fresh clone of ``base`` with ``recipes`` applied in order."""
    setup = base.clone()
    for recipe in recipes:
        recipe.apply(setup, ctx)
        setup.applied.append(recipe.name)
    return setup


def build_with(base: TrainStep, accepted: list[Recipe], recipe: Recipe, ctx: Context,
               order: dict[str, int]) -> tuple[TrainStep, str]:
    """A fresh clone of ``base`` with ``accepted`` and ``recipe`` applied in the recipes'
    order (``recipe`` before a compiler accepted earlier, on a second pass), and what
    ``recipe.apply`` said it did."""
    setup, reason = base.clone(), ""
    for r in sorted([*accepted, recipe], key=lambda r: order.get(r.name, len(order))):
        said = r.apply(setup, ctx)
        setup.applied.append(r.name)
        reason = said if r is recipe else reason
    return setup, reason


def try_in_process(recipe: Recipe, bench: Bench, accepted: list[Recipe], current: TrainStep,
                   arm: Arm, test: SequentialTest) -> tuple[RecipeResult, TrainStep | None, Trajectory | None]:
    """Build base + accepted + ``recipe`` afresh, judge its seeded trajectory against the arm
    it would replace (``gate.py``), then time it against ``current`` in paired rounds until
    ``test`` decides (its minimum rounds only when the numerics failed: the speed is shown,
    not needed)."""
    settings, say = bench.settings, bench.say
    result = RecipeResult(recipe.name, recipe.family, True, "", measured_in="this process")
    steps = gate_steps(recipe, arm, settings.numerics_steps, settings.gate())
    try:
        candidate, result.reason = build_with(bench.base, accepted, recipe, bench.ctx, bench.order)
        say(f"{recipe.name}: numerics ({steps} seeded steps)")
        trajectory = record_trajectory(candidate, steps, settings.seed)
    except Exception as exc:  # any failure of a recipe is its verdict, reported in full
        result.decision = f"rejected: applying it failed: {first_line(exc)}"
        result.reason = result.reason or first_line(exc)
        return result, None, None
    result.first_step_ms = trajectory.first_step_ms
    if recipe.precision or arm.precision:
        say(f"{recipe.name}: {recipe.precision or arm.precision} gate")
    fresh = FreshSetups(lambda: build(bench.base, accepted, bench.ctx),
                        lambda: build_with(bench.base, accepted, recipe, bench.ctx, bench.order)[0])
    verdict = judge(recipe, arm, trajectory, ctx=bench.ctx, gate=settings.gate(), rounding=bench.rounding,
                    calibration=bench.calibration, fresh=fresh)
    result.tolerance = verdict.question
    if not verdict.numerics.passed:
        test.max_rounds = test.min_rounds
    say(f"{recipe.name}: paired A/B (at most {test.max_rounds} rounds)")
    ab = interleaved(current.run, candidate.run, test.max_rounds, settings.warmup, test=test,
                     on_round=lambda done, found: say(round_line(recipe.name, done, test, found)))
    result.decide(verdict.numerics, ab, settings.min_speedup, "rounds")
    return result, candidate, trajectory


def try_in_children(recipe: Recipe, bench: Bench, accepted: list[Recipe], current: TrainStep,
                    env: dict[str, str], arm: Arm, test: SequentialTest) -> RecipeResult:
    """A process-level recipe: arms A (the current setup, its environment) and B (A plus the
    recipe's environment) in child processes, a pair a round until ``test`` decides; B is
    judged against A's own trajectory."""
    settings = bench.settings
    result = RecipeResult(recipe.name, recipe.family, True, "",
                          measured_in=f"child processes (at most {test.max_rounds} per arm, one per arm a round)")
    probe = copy.copy(current)
    probe.env = dict(env)
    try:
        result.reason = recipe.apply(probe, bench.ctx)
    except Exception as exc:  # reported as the recipe's verdict
        result.decision = f"rejected: applying it failed: {first_line(exc)}"
        return result
    result.env = {k: v for k, v in probe.env.items() if env.get(k) != v}
    env_a = {**os.environ, **env}
    payload = child_payload(bench.base, accepted, settings,
                            gate_steps(recipe, arm, settings.numerics_steps, settings.gate()))
    try:
        ab, first_a, first_b = children_ab((payload, env_a), (payload, {**env_a, **probe.env}), settings,
                                           bench.say, recipe.name, test)
    except ChildSetupError as exc:  # unpicklable user model: say so in the verdict
        result.decision = f"rejected: the setup cannot be passed to a child process: {exc}"
        return result
    except (ProfileDNNError, subprocess.TimeoutExpired) as exc:
        result.decision = f"rejected: {first_line(exc)}"
        return result
    as_traj = lambda out: Trajectory(out["losses"], out["grads"], out["first_step_ms"])  # noqa: E731
    result.first_step_ms = first_b["first_step_ms"]
    verdict = judge(recipe, Arm(as_traj(first_a), arm.precision), as_traj(first_b), ctx=bench.ctx,
                    gate=settings.gate(), rounding=bench.rounding, calibration=bench.calibration)
    result.tolerance = verdict.question
    result.decide(verdict.numerics, ab, settings.min_speedup, "rounds")
    result.measured_in = in_children(len(ab.pairs))
    faults = faults_note(first_a["faults_per_step"], first_b["faults_per_step"])
    if faults:
        result.decision += f"; {faults}"
    return result


__all__ = ["Bench", "build", "build_with", "try_in_children", "try_in_process"]
