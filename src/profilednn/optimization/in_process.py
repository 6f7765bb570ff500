"""The arms of a built-in setup (or one given to ``profilednn.optimize``): the search's
:class:`~.search.Arms` that measures in this process.

An in-process recipe's candidate is built afresh on the caller's setup with the recipes
accepted so far and timed against the current best, interleaved (``trial.py``); a
process-level recipe (allocator, threads) runs both arms in child processes
(``child_ab.py``). The ending: the accepted recipes' numerics together and the total
(``final.py``), FLOPs and peaks (``flops.py``), the headroom split (``headroom.py``).
"""

from __future__ import annotations

import torch

from ..train_step import TrainStep
from .abtest import interleaved
from .final import final_ab, final_numerics
from .flops import count_flops
from .gate import Arm
from .headroom import measure_headroom
from .numerics import Trajectory
from .recipes import Recipe
from .reference import Reference
from .results import RecipeResult
from .search import Ending, SearchState
from .sequential import log_ratios
from .trial import Bench, try_in_children, try_in_process


class InProcessArms:
    """Arms built from the caller's setup (never modified): the current best setup, warm,
    and its seeded trajectory (the arm the next recipe would replace)."""

    def __init__(self, bench: Bench, reference: Reference) -> None:
        self.bench, self.reference, self.say = bench, reference, bench.say
        self.current: TrainStep = bench.base.clone()
        self.arm = Arm(reference.trajectory)
        self._candidate: tuple[TrainStep | None, Trajectory | None] = (None, None)
        self._noise_measured = False

    def applies(self, recipe: Recipe, state: SearchState) -> str | None:
        return recipe.check(self.current, self.bench.ctx)

    def trial(self, recipe: Recipe, state: SearchState) -> RecipeResult:
        settings = self.bench.settings
        if not self._noise_measured:
            self._measure_noise(state)
        if recipe.fresh_process:
            result = try_in_children(recipe, self.bench, state.accepted, self.current, state.env, self.arm,
                                     state.budget.test(settings.child_runs))
        else:
            result, candidate, trajectory = try_in_process(recipe, self.bench, state.accepted, self.current,
                                                           self.arm, state.budget.test(settings.rounds))
            self._candidate = (candidate, trajectory)
            state.budget.noise.add_repeats(result.samples_before)  # A's back-to-back rounds
        return result

    def _measure_noise(self, state: SearchState) -> None:
        """This machine's A-vs-A noise for the workload: the stock setup timed against itself
        in ``noise_rounds`` paired rounds, before the first A/B."""
        self._noise_measured = True
        rounds = self.bench.settings.noise_rounds
        if rounds < 1:
            return
        self.say(f"A-vs-A: the stock setup against itself ({rounds} rounds)")
        ab = interleaved(self.current.run, self.current.run, rounds, self.bench.settings.warmup + 1)
        state.budget.noise.add(log_ratios(ab.pairs))
        self.say(state.budget.noise.describe())

    def take(self, recipe: Recipe, state: SearchState) -> None:
        candidate, trajectory = self._candidate
        if candidate is None or trajectory is None:
            raise RuntimeError(f"{recipe.name} was accepted without a candidate setup")  # a driver bug, not input
        self.current = candidate  # warm, and exactly base + accepted recipes
        self.arm = Arm(trajectory, state.precision)
        self._candidate = (None, None)

    def ending(self, state: SearchState) -> Ending:
        bench, settings = self.bench, self.bench.settings
        numerics = final_numerics(bench, state.accepted, self.reference)
        noise = self.reference.noise
        end = Ending(numerics=numerics, threads=torch.get_num_threads(),
                     rounding_noise=None if noise is None else {"loss_max_rel_diff": noise.loss_max_rel_diff,
                                                                 "grad_rel_diff": noise.grad_rel_diff},
                     notes=[] if numerics is None or numerics.passed else [
                         f"the accepted recipes together drift from stock: {numerics.detail}"])
        final_ab(bench, state, self.current, end)
        if settings.measure_flops:
            end.flops = count_flops(bench.base, state.accepted, bench.ctx, self.say)
        end.headroom, why = (None, None) if not settings.headroom else measure_headroom(  # below the peak, by op family
            self.current, settings.headroom_steps, end.flops.by_dtype_final, end.flops.peaks, self.say, state.env)
        end.notes += end.flops.notes + ([why] if why else [])
        return end


__all__ = ["InProcessArms"]
