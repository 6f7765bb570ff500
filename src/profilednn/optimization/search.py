"""The one search over recipes, for every kind of arm: each recipe in turn, then a second
pass, then the ending (total, numerics, FLOPs, headroom) and the report.

Each recipe is checked against the current best setup, tried and, when accepted,
composed: the next recipe is measured against it. Then the in-process recipes rejected for
speed alone are tried once more where later recipes changed the arm: what BF16 makes of
the step decides again (FrozenBatchNorm's fp32 affine costs little in fp32 and, under BF16
autocast, promotes every frozen activation back to fp32).

What a recipe is measured *with* is an :class:`Arms`: a built-in setup's arms run in this
process (``in_process.py``; its launch-environment arms in child processes), a user's
script's arms are each a child process (``script/search.py``). The driver below does not
know which: it holds the search's state, decides the order and the second pass, and
assembles the report from the arms' ending.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

from ..progress import Progress
from .abtest import Timing
from .budget import Budget
from .flops import FlopCount
from .headroom import Headroom
from .numerics import NumericsResult
from .partial import OnResults
from .recipes import Recipe
from .results import OptimizeReport, RecipeResult
from .sequential import Interval
from .settings import Settings



@dataclass
class SearchState:
    """The recipes tried so far: the accepted in-process ones (in the recipes' order), the
    launch environment of the accepted process-level ones, the arm's precision, one result
    per recipe, and what each accepted in-process recipe said it did."""

    accepted: list[Recipe] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    results: list[RecipeResult] = field(default_factory=list)
    precision: str | None = None
    budget: Budget = field(default_factory=lambda: Budget(None, 1.0))  # each A/B's test and the pooled noise

    @property
    def names(self) -> list[str]:
        """The accepted in-process recipes' names, in order."""
        return [r.name for r in self.accepted]

    @property
    def applied(self) -> dict[str, str]:
        """What each accepted in-process recipe said it did."""
        names = set(self.names)
        return {r.recipe: r.reason for r in self.results if r.accepted and r.recipe in names}

    def accept(self, recipe: Recipe, result: RecipeResult, order: dict[str, int]) -> None:
        """Compose an accepted recipe into the arm the next one is measured against."""
        if recipe.fresh_process:
            self.env.update(result.env)
            return
        self.accepted = sorted([*self.accepted, recipe], key=lambda r: order.get(r.name, len(order)))
        self.precision = recipe.precision or self.precision


@dataclass
class Ending:
    """What the arms measured after the search: the total (stock vs optimized), where it
    ran, the accepted recipes' numerics together, FLOPs and peaks, the headroom split, the
    threads, the rounding-level noise (its loss and gradient figures) and the notes to keep."""

    baseline: Timing | None = None
    final: Timing | None = None
    interval: Interval | None = None  # the total speedup's
    measured_in: str | None = None
    numerics: NumericsResult | None = None
    flops: FlopCount = field(default_factory=FlopCount)
    headroom: Headroom | None = None
    threads: int = 0
    rounding_noise: dict[str, float | None] | None = None  # the numerics tolerance's calibration
    notes: list[str] = field(default_factory=list)


class Arms(Protocol):
    """One kind of arm the search measures recipes with."""

    say: Progress

    def applies(self, recipe: Recipe, state: SearchState) -> str | None:
        """None when ``recipe`` applies to the current arm, else why not (one line)."""

    def trial(self, recipe: Recipe, state: SearchState) -> RecipeResult:
        """``recipe`` against the current arm: numerics and the A/B, decided."""

    def take(self, recipe: Recipe, state: SearchState) -> None:
        """Make the arm of an accepted in-process ``recipe`` (just tried) the current one."""

    def ending(self, state: SearchState) -> Ending:
        """The total, numerics, FLOPs and headroom of the accepted recipes."""


def rejected_for_speed(result: RecipeResult) -> bool:
    """It applied and its numerics passed, but it was not fast enough: worth a second pass
    once later recipes changed the arm."""
    return result.applies and not result.accepted and result.numerics == "pass" and result.speedup is not None


def applying(later: list[Recipe], arms: Arms, state: SearchState) -> int:
    """How many of the ``later`` recipes apply to the arm as it stands: the A/Bs the time left
    is shared over. A recipe that will be skipped takes no time, and counting it (11 of the 17
    on pytorch/examples' dcgan) left each A/B two rounds and a third of the budget unspent."""
    return sum(1 for recipe in later if arms.applies(recipe, state) is None)


def _order(chosen: list[Recipe]) -> dict[str, int]:
    return {r.name: i for i, r in enumerate(chosen)}


def _decide(recipe: Recipe, arms: Arms, state: SearchState, order: dict[str, int]) -> RecipeResult:
    """Does ``recipe`` apply; if so try it and fold it in when accepted."""
    arms.say(f"{recipe.name}: does it apply?")
    reason = arms.applies(recipe, state)
    if reason is not None:
        return RecipeResult(recipe.name, recipe.family, False, reason, decision=f"skipped: {reason}")
    return _tried(recipe, arms, state, order)


def _tried(recipe: Recipe, arms: Arms, state: SearchState, order: dict[str, int]) -> RecipeResult:
    """``recipe`` tried against the current arm, and composed into it when accepted; its
    rounds' spread joins the pooled noise the next A/Bs' intervals borrow."""
    result = arms.trial(recipe, state)
    state.budget.noise.add_paired(result.paired_log_ratios)
    if result.accepted:
        state.accept(recipe, result, order)
        if not recipe.fresh_process:
            arms.take(recipe, state)
    return result


def search(chosen: list[Recipe], arms: Arms, on_results: OnResults | None = None,
           budget: Budget | None = None) -> SearchState:
    """Each recipe in ``chosen`` in turn against the stock arm, then the second pass, each A/B
    planned within ``budget``; ``on_results`` hears every result so far each time one is decided."""
    state, order = SearchState(budget=budget or Budget(None, 1.0)), _order(chosen)
    kept = on_results or (lambda results: None)
    tried_with: dict[int, set[str]] = {}  # result index -> the in-process recipes its arm had
    for i, recipe in enumerate(chosen):
        state.budget.recipes_left = 1 + applying(chosen[i + 1:], arms, state)
        then = set(state.names)
        result = _decide(recipe, arms, state, order)
        if not recipe.fresh_process and rejected_for_speed(result):
            tried_with[len(state.results)] = then
        state.results.append(result)
        kept(state.results)
    _second_pass(chosen, arms, state, order, tried_with, kept)
    return state


def _second_pass(chosen: list[Recipe], arms: Arms, state: SearchState, order: dict[str, int],
                 tried_with: dict[int, set[str]], kept: OnResults) -> None:
    """In-process recipes rejected for speed alone, tried once more where recipes after them
    in the order were accepted since: under BF16 or a compiled model the same change can pay
    where it did not in fp32."""
    by_name = {r.name: r for r in chosen}
    for k, (index, then) in enumerate(tried_with.items()):
        state.budget.recipes_left = len(tried_with) - k
        first = state.results[index]
        recipe = by_name[first.recipe]
        since = [n for n in state.names if n not in then and order.get(n, 0) > order[recipe.name]]
        if not since or arms.applies(recipe, state) is not None:
            continue
        arms.say(f"{recipe.name}: second pass, after {', '.join(since)}")
        result = _tried(recipe, arms, state, order)
        result.decision += (f" (second pass, after {', '.join(since)}; first pass {first.speedup:.3f}x"
                            f" against {first.before_ms:.1f} ms)")
        state.results[index] = result
        kept(state.results)


def env_note(env: dict[str, str], measured_in: str | None) -> list[str]:
    """How to start training with the process-level settings that won."""
    if not env:
        return []
    return ["process-level settings were measured in child processes; start training with "
            + " ".join(f"{k}={v}" for k, v in env.items())
            + (" (the total above includes them)" if measured_in and measured_in.startswith("child")
               else " (the total above does not include them)")]


def resolution_note(state: SearchState, settings: Settings) -> list[str]:
    """Where a recipe ended inconclusive: the smallest gain this machine's noise lets an A/B
    of ``settings.rounds`` rounds accept, and what resolves smaller ones."""
    if not any(r.outcome == "inconclusive" for r in state.results):
        return []
    noise = state.budget.noise
    detectable = noise.detectable(settings.min_speedup, settings.rounds)
    if detectable is None:
        return []
    return [f"with this machine's noise for the workload ({noise.pooled_text()}), the "
            f"smallest speedup an A/B of {settings.rounds} rounds tells from the {settings.min_speedup:.2f}x bar is "
            f"about {detectable:.2f}x (accepted half the time there); smaller gains end inconclusive: longer "
            "samples (a script: more --steps per run), more --rounds and --time-budget, or a quieter machine "
            "resolve them"]


def scatter_note(end: Ending) -> list[str]:
    """Why the total's interval is wider than the pooled noise alone would make it: the
    optimized arm scatters more than the stock one, or the total's rounds scatter beyond the
    pool (a recipe's own decision line says the same for its A/B)."""
    found = end.interval
    if found is None or not found.scatter_text():
        return []
    return [f"the total (stock A, optimized B): {found.scatter_text()}"]


def report_of(workload: str, state: SearchState, end: Ending, settings: Settings) -> OptimizeReport:
    """The search's outcome as the one report every arm kind gives."""
    flops = end.flops
    return OptimizeReport(
        workload=workload,
        recipes=state.results,
        accepted=state.names + [r.recipe for r in state.results if r.accepted and r.env],
        environment=dict(state.env),
        baseline=end.baseline,
        final=end.final,
        flops_per_step=flops.total,
        gemm_peak_gflops=None if flops.peaks is None else flops.peaks.get("fp32"),
        flops_by_dtype=flops.by_dtype,
        flops_by_dtype_final=flops.by_dtype_final,
        peak_gflops_by_dtype=flops.peaks or None,
        threads=end.threads,
        final_numerics=end.numerics,
        final_measured_in=end.measured_in,
        rounding_noise=end.rounding_noise,
        settings=asdict(settings),
        notes=[*end.notes, *env_note(state.env, end.measured_in), state.budget.describe(),
               *resolution_note(state, settings), *scatter_note(end)],
        headroom=end.headroom,
        speedup_ci=None if end.interval is None else end.interval.as_list(),
        total_speedup=None if end.interval is None else end.interval.point,
        a_vs_a=state.budget.noise.to_dict() if state.budget.noise.pooled_df else None,
    )


def run_search(workload: str, chosen: list[Recipe], arms: Arms, settings: Settings,
               on_results: OnResults | None = None) -> tuple[OptimizeReport, SearchState]:
    """The whole search with ``arms``, planned within ``settings.time_budget_s``: the passes,
    the ending, the report."""
    state = search(chosen, arms, on_results, Budget(settings.budget_s, settings.min_speedup))
    return report_of(workload, state, arms.ending(state), settings), state


__all__ = ["Arms", "Ending", "SearchState", "applying", "env_note", "rejected_for_speed", "report_of",
           "resolution_note", "run_search", "scatter_note", "search"]
