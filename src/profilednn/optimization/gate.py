"""Which numerics question each recipe is asked: against the arm it would replace, at that
arm's precision.

``optimize`` keeps one *arm* (the stock setup with the recipes accepted so far): its seeded
trajectory from the stock weights and the number format it computes in. A candidate recipe
is judged by one of four gates:

- **environment** (``changes_arithmetic = False``: threads, affinity, allocator, DataLoader
  workers): the same losses as the arm, bit for bit, or within the arm's own noise floor
  (stock's drift under weight noise at the arm's precision, times the allowed factor).
  Gradients are reported, never decisive: a thread count that reorders a BF16 reduction
  moves a randomly initialised network's gradients chaotically while it trains the same.
- **precision** (the recipe moves to a reduced format, ``precision = "bf16"``): the
  precision gate (``precision_gate.py``) against stock at that format's resolution.
- **at the arm's precision** (any other recipe once the arm computes in a reduced format):
  the candidate's loss trajectory against the arm's, within max(stated loss tolerance,
  factor x the noise floor at that precision). A recipe that really changes the training
  still fails; BF16's gradient chaos does not fail it.
- **fp32** (the arm is fp32): losses and first-step gradients against the arm's, within
  the recipe's stated tolerance widened by stock's rounding noise (``numerics.calibrated``).

All of these run with dropout off. A recipe that changes the random stream
(``random_stream = True``: ``fused_dropout``) must pass its gate above and then the
random-stream gate (``stream_gate.py``) with dropout on, on fresh setups the caller builds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from .numerics import NumericsResult, Trajectory, calibrated, compare_trajectories
from .precision_gate import NOISE_FLOOR_MIN, Calibration, GateSettings, judge_trajectory, precision_gate
from .recipe_contract import Context, Recipe, Tolerance
from .stream_gate import FreshSetups, stream_gate


@dataclass
class Arm:
    """The setup a candidate would replace: its seeded trajectory (from the stock weights)
    and the number format it computes in (None: fp32)."""

    trajectory: Trajectory
    precision: str | None = None


@dataclass
class Verdict:
    """A gate's result and the one-line statement of what it asked."""

    numerics: NumericsResult
    question: str


def gate_steps(recipe: Recipe, arm: Arm, numerics_steps: int, gate: GateSettings) -> int:
    """Seeded steps the candidate runs: the precision gate's length where a reduced format
    is involved (the arm's trajectory has that length then), else ``numerics_steps``."""
    return gate.steps if recipe.precision or arm.precision else numerics_steps


def environment_gate(arm: Trajectory, candidate: Trajectory, noise_floor: float, factor: float,
                     precision: str | None) -> Verdict:
    """Bit-identical losses, or within ``factor`` x the arm's noise floor; gradients reported."""
    allowed = factor * max(noise_floor, NOISE_FLOOR_MIN)
    raw = compare_trajectories(arm, candidate, Tolerance(allowed, math.inf))
    fmt = precision or "fp32"
    question = (f"changes no arithmetic: losses as the arm's ({fmt}) bit for bit, or within {allowed:.2e} "
                f"({factor:g} x the arm's own noise floor at {fmt} resolution); gradients not decisive")
    finite = all(math.isfinite(x) for x in candidate.losses)
    identical = finite and len(candidate.losses) == len(arm.losses) and all(
        a == b for a, b in zip(arm.losses, candidate.losses))
    grads = f"gradients rel L2 {raw.grad_rel_diff:.2e}" if arm.grads else ""  # a script's are not read
    if identical:
        detail = f"losses bit-identical to the arm's over {raw.steps} steps" + (f" ({grads})" if grads else "")
        verdict = "pass"
    elif finite and raw.loss_max_rel_diff <= allowed:
        detail = (f"losses within the arm's noise: max rel diff {raw.loss_max_rel_diff:.2e} <= {allowed:.2e} over "
                  f"{raw.steps} steps" + (f" ({grads}, not decisive)" if grads else ""))
        verdict = "pass"
    else:
        detail = (f"losses moved beyond the arm's noise: max rel diff {raw.loss_max_rel_diff:.2e} > {allowed:.2e} "
                  f"over {raw.steps} steps")
        verdict = "fail"
    return Verdict(replace(raw, verdict=verdict, detail=detail), question)


def judge(recipe: Recipe, arm: Arm, candidate: Trajectory, *, ctx: Context, gate: GateSettings,
          rounding: NumericsResult | None, calibration: Callable[[str], Calibration],
          fresh: FreshSetups | None = None) -> Verdict:
    """The candidate's trajectory judged by the gate that fits ``recipe`` and ``arm`` (see
    the module doc). ``rounding``: stock's drift under fp32 rounding-level weight noise (None:
    not measured); ``calibration(precision)``: stock's trajectory and noise at a format's
    resolution (measured once per format by the caller); ``fresh``: builders of the arm and
    the candidate, which a random-stream recipe needs (without them it fails)."""
    verdict = _judge(recipe, arm, candidate, ctx=ctx, gate=gate, rounding=rounding, calibration=calibration)
    if not recipe.random_stream:
        return verdict
    question = (f"{verdict.question}; random stream, with dropout on: every dropout site keeps 1-p and scales by "
                f"1/(1-p) within {gate.stream_z:g} standard deviations, its backward uses its mask, and the loss "
                f"trajectory is within {gate.factor:g} x the arm's spread between two dropout seeds")
    if not verdict.numerics.passed:
        return Verdict(verdict.numerics, question)
    if fresh is None:
        result = replace(verdict.numerics, verdict="fail", detail="random stream not checked: the gate was given no "
                         "setups to run with dropout on")
        return Verdict(result, question)
    stream = stream_gate(fresh, len(candidate.losses), recipe.tolerance, gate)
    result = replace(verdict.numerics, verdict=stream.verdict, detail=f"{verdict.numerics.detail}; {stream.detail}")
    return Verdict(result, question)


def _judge(recipe: Recipe, arm: Arm, candidate: Trajectory, *, ctx: Context, gate: GateSettings,
           rounding: NumericsResult | None, calibration: Callable[[str], Calibration]) -> Verdict:
    if not recipe.changes_arithmetic:
        floor = calibration(arm.precision).noise.loss_max_rel_diff if arm.precision else (
            rounding.loss_max_rel_diff if rounding is not None else 0.0)
        return environment_gate(arm.trajectory, candidate, floor, gate.factor, arm.precision)
    if recipe.precision:
        question = (f"{recipe.precision} gate: loss trajectory over {gate.steps} steps within max(stated "
                    f"{recipe.tolerance.loss_rtol:g}, {gate.factor:g} x stock's drift under weight noise at "
                    f"{recipe.precision} resolution); else the digits task to {gate.digits_target:.0%} accuracy")
        return Verdict(precision_gate(recipe, calibration(recipe.precision), candidate, ctx, gate), question)
    if arm.precision:
        calib = calibration(arm.precision)
        result, _ = judge_trajectory(Calibration(arm.precision, arm.trajectory, calib.noise), candidate,
                                     recipe.tolerance, gate)
        question = (f"at the arm's precision ({arm.precision}): loss trajectory over {gate.steps} steps against "
                    f"the arm's within max(stated {recipe.tolerance.loss_rtol:g}, {gate.factor:g} x the noise "
                    f"floor at {arm.precision} resolution); gradients not decisive")
        return Verdict(result, question)
    tolerance = calibrated(recipe.tolerance, rounding, gate.factor)
    question = tolerance.describe()
    if rounding is not None:
        question += (f" (stated: {recipe.tolerance.loss_rtol:g} / {recipe.tolerance.grad_rtol:g}; stock's own drift "
                     f"under rounding-level weight noise: loss {rounding.loss_max_rel_diff:.1e}, gradients "
                     f"{rounding.grad_rel_diff:.1e}, allowed x{gate.factor:g})")
    return Verdict(compare_trajectories(arm.trajectory, candidate, tolerance), question)


__all__ = ["Arm", "FreshSetups", "Verdict", "environment_gate", "gate_steps", "judge"]
