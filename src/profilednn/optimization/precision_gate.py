"""The numerics gate for recipes that change precision (``dtype_policy``: BF16).

One step's gradients are the wrong test for BF16: a randomly initialised deep network is
chaotic at BF16's resolution (ResNet-50: first-step gradients 1.3 relative L2 from fp32
while the loss moved 0.3 %; a weight perturbation of 2**-24 already moves them 2.3 %).
The question is whether BF16 *trains* as well. So, calibrated at the recipe's own
resolution:

1. **Noise floor**: the stock setup against itself with every weight multiplied by
   (1 + 2**-8 N(0, 1)) -- BF16's resolution -- over ``steps`` seeded steps.
2. **Loss trajectory**: the candidate over the same ``steps``; it passes when every loss
   is finite and its largest relative loss difference from stock is within
   max(stated loss tolerance, ``factor`` x the noise floor's). Gradients are reported
   (with the noise floor's, for scale) and must be finite; they do not decide.
3. **A short real task** when the trajectory is not conclusive (finite but outside the
   bound): the digits (scikit-learn's, shipped, no download) trained by an MLP with and
   without the recipe, same seed and batches; it passes when the stock arm reaches the
   accuracy target and the recipe's arm reaches it too, within ``margin`` of stock. A recipe
   that is no change to a training state says how its two arms train (``Recipe.digits_arms``:
   ``ddp_bf16_allreduce`` splits each batch over the job's ranks, ``GateSettings.ranks``, and
   reduces the shards' gradients as its hook does against DDP's fp32 average).

A non-finite loss or gradient fails at once. Figures of every stage are in the detail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..train_step import TrainStep
from .numerics import NumericsResult, Trajectory, compare_trajectories, perturb_weights, record_trajectory
from .recipe_contract import Recipe, Tolerance

if TYPE_CHECKING:
    from .recipe_contract import Context

# Relative weight perturbation at a format's resolution (half an ulp: 2**-(mantissa bits + 1)).
RESOLUTION = {"bf16": 2.0**-8, "fp16": 2.0**-11}
NOISE_FLOOR_MIN = 1e-4  # a loss drift below this is indistinguishable from summation order


@dataclass(frozen=True)
class GateSettings:
    """How the precision gate judges: trajectory length, allowed multiple of the noise
    floor, and the digits task (epochs, batch, accuracy target, allowed shortfall, the job's
    ranks for a recipe on DDP's allreduce); and how
    far the random-stream gate lets a dropout site's statistics stray (``stream_gate.py``)."""

    steps: int = 8
    factor: float = 5.0
    digits_epochs: int = 6
    digits_batch: int = 64
    digits_target: float = 0.90
    digits_margin: float = 0.02
    seed: int = 0
    ranks: int = 1  # the job's ranks: a DDP recipe's digits task splits each batch over them (at least 2)
    stream_z: float = 6.0  # random-stream gate: standard deviations a dropout site may stray


@dataclass
class Calibration:
    """The stock setup's long trajectory and its drift under weight noise at ``precision``'s resolution."""

    precision: str
    reference: Trajectory
    noise: NumericsResult


def calibrate(base: TrainStep, precision: str, gate: GateSettings) -> Calibration:
    """Record stock over ``gate.steps`` and stock-with-perturbed-weights against it."""
    if precision not in RESOLUTION:
        raise ValueError(f"no resolution known for {precision!r} (known: {', '.join(RESOLUTION)})")
    reference = record_trajectory(base.clone(), gate.steps, gate.seed)
    noisy = base.clone()
    perturb_weights(noisy, gate.seed + 1, RESOLUTION[precision])
    noise = compare_trajectories(reference, record_trajectory(noisy, gate.steps, gate.seed),
                                 Tolerance(math.inf, math.inf))
    return Calibration(precision, reference, noise)


def _finite(traj: Trajectory) -> bool:
    return all(math.isfinite(x) for x in traj.losses) and all(
        bool(torch.isfinite(g).all()) for g in traj.grads.values())


def judge_trajectory(calib: Calibration, candidate: Trajectory, stated: Tolerance,
                     gate: GateSettings) -> tuple[NumericsResult, bool]:
    """(result, conclusive): the candidate's loss trajectory against the calibrated bound."""
    floor = max(calib.noise.loss_max_rel_diff, NOISE_FLOOR_MIN)
    allowed = max(stated.loss_rtol, gate.factor * floor)
    raw = compare_trajectories(calib.reference, candidate, Tolerance(allowed, math.inf))
    read_grads = bool(calib.reference.grads)  # a script's gradients are not read
    scale = (f"stock's own drift with weights perturbed at {calib.precision} resolution "
             f"({RESOLUTION[calib.precision]:g} relative): loss {calib.noise.loss_max_rel_diff:.2e}"
             + (f", gradients {calib.noise.grad_rel_diff:.2e}" if read_grads else ""))
    figures = (f"{calib.precision} loss trajectory over {raw.steps} steps: max rel diff "
               f"{raw.loss_max_rel_diff:.2e} (allowed {allowed:.2e} = max(stated {stated.loss_rtol:g}, "
               f"{gate.factor:g} x noise floor)); "
               + (f"first-step gradients rel L2 {raw.grad_rel_diff:.2e} (reported, not decisive); " if read_grads
                  else "")
               + scale)
    if not _finite(candidate) or not math.isfinite(raw.grad_rel_diff):
        return replace(raw, verdict="fail", detail=f"not finite: {raw.detail}"), True
    if raw.loss_max_rel_diff <= allowed:
        return replace(raw, verdict="pass", detail=f"trains as stock: {figures}"), True
    return replace(raw, verdict="fail", detail=f"trajectory outside the bound: {figures}"), False


@dataclass(frozen=True)
class DigitsOutcome:
    """Test accuracy of the digits MLP trained without and with the recipe."""

    stock_accuracy: float
    recipe_accuracy: float
    target: float
    margin: float
    epochs: int
    applied: bool
    reason: str = ""
    how: str = ""  # how the arms trained, where not by the recipe applied to a training state

    @property
    def passed(self) -> bool:
        return (self.applied and self.stock_accuracy >= self.target
                and self.recipe_accuracy >= min(self.target, self.stock_accuracy - self.margin))

    def describe(self) -> str:
        if not self.applied:
            return f"digits task not run: {self.reason}"
        how = f"; {self.how}" if self.how else ""
        return (f"digits task ({self.epochs} epochs{how}): test accuracy stock {self.stock_accuracy:.3f}, "
                f"with the recipe {self.recipe_accuracy:.3f} (target {self.target:.2f}, allowed "
                f"shortfall {self.margin:.2f})")


def _digits_setup(gate: GateSettings) -> tuple[TrainStep, torch.Tensor, torch.Tensor]:
    from ..workloads.digits import digits_mlp, load_digits_data

    data = load_digits_data(seed=gate.seed)
    model = digits_mlp(seed=gate.seed)
    g = torch.Generator().manual_seed(gate.seed)
    order = torch.randperm(len(data.y_train), generator=g)
    batches = [(data.x_train[order[i:i + gate.digits_batch]], data.y_train[order[i:i + gate.digits_batch]])
               for i in range(0, len(order), gate.digits_batch)]
    setup = TrainStep(model, torch.optim.Adam(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(), batches)
    return setup, data.x_test, data.y_test


def _train_and_test(setup: TrainStep, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int,
                    step: Callable[[TrainStep], object] = TrainStep.run) -> float:
    """Train ``epochs`` passes over the batches (``step``: one of them, from the next batch),
    then the test accuracy. One thread: the MLP is far too small to gain from more, and on a
    loaded machine extra threads only wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup.rewind()
        torch.manual_seed(seed)
        for _ in range(epochs * len(setup.batches)):
            step(setup)
        with torch.no_grad():
            return float((setup.forward(x).argmax(dim=1) == y).float().mean())
    finally:
        torch.set_num_threads(threads)


def digits_task(recipes: Recipe | Sequence[Recipe], ctx: "Context", gate: GateSettings) -> DigitsOutcome:
    """Train the digits MLP stock and with ``recipes`` (one, or several together: same seed,
    batches, epochs); a recipe that says how its arms train (``digits_arms``) is trained that
    way, the others applied to the candidate (``check``, ``apply``) before it trains."""
    together = [recipes] if isinstance(recipes, Recipe) else list(recipes)
    stock, x, y = _digits_setup(gate)
    candidate = stock.clone()
    with_arms = [(r, arms) for r in together if (arms := r.digits_arms(ctx, gate.ranks)) is not None]
    not_run = partial(DigitsOutcome, 0.0, 0.0, gate.digits_target, gate.digits_margin, gate.digits_epochs, False)
    if len(with_arms) > 1:
        return not_run(f"{' and '.join(r.name for r, _ in with_arms)} each train arms of their own")
    owner, arms = with_arms[0] if with_arms else (None, None)
    for recipe in (r for r in together if r is not owner):  # the rest applied to the candidate
        reason = recipe.check(candidate, ctx)
        if reason is not None:
            named = f"{recipe.name} does not" if len(together) > 1 else "the recipe does not"
            return not_run(f"{named} apply to it ({reason})")
        recipe.apply(candidate, ctx)
    step_a, step_b, how = (arms.stock, arms.recipe, arms.how) if arms else (TrainStep.run, TrainStep.run, "")
    if len(together) > 1:
        how = "; ".join(filter(None, [f"{' + '.join(r.name for r in together)} together", how]))
    a = _train_and_test(stock, x, y, gate.digits_epochs, gate.seed, step_a)
    b = _train_and_test(candidate, x, y, gate.digits_epochs, gate.seed, step_b)
    return DigitsOutcome(a, b, gate.digits_target, gate.digits_margin, gate.digits_epochs, True, how=how)


def precision_gate(recipes: Recipe | Sequence[Recipe], calib: Calibration, candidate: Trajectory,
                   ctx: "Context", gate: GateSettings) -> NumericsResult:
    """The whole gate (see the module doc): trajectory, then the digits task if needed.
    Several recipes: the accepted ones together (an optimize's final check), judged at the
    loosest of their loss tolerances, the digits task trained with each of them that
    changes precision."""
    together = [recipes] if isinstance(recipes, Recipe) else list(recipes)
    stated = Tolerance(max(r.tolerance.loss_rtol for r in together), math.inf)
    result, conclusive = judge_trajectory(calib, candidate, stated, gate)
    if conclusive:
        return result
    digits = digits_task([r for r in together if r.precision] or together, ctx, gate)
    verdict = "pass" if digits.passed else "fail"
    how = "trains the digits as well as stock" if digits.passed else "does not train the digits as well as stock"
    return replace(result, verdict=verdict, detail=f"{how}: {digits.describe()}; {result.detail}")


__all__ = ["Calibration", "DigitsOutcome", "GateSettings", "RESOLUTION", "calibrate", "digits_task",
           "judge_trajectory", "precision_gate"]
