"""The arms of ``optimize -- python train.py``: the one search (``..search``) measures each
recipe on the user's own, unmodified script through :class:`ScriptSearch`.

The script is run many times, each time in a fresh child process (``arm.py``) that trains
for a window of ``warmup`` + ``child_steps`` optimizer steps and is then stopped (the runs and
their pairing: ``runs.ScriptRuns``):

1. **Stock** (:meth:`ScriptSearch.start`): once, to see what the script holds (root
   modules, optimizers, DataLoaders, its loss) and its seeded loss trajectory. A script
   that never steps its optimizer, ends early or whose loss is not finite stops the job
   here with a one-line reason (the Run is kept, ``failed``).
2. **Noise arms** (the numerics gate's calibration, as in the built-in path): the stock
   script with its weights perturbed at fp32 rounding level (``calibrate_noise=False``:
   skipped) and, once a BF16 question comes up, at BF16 resolution.
3. **Each recipe**, as the driver asks: applies to the script (``checks.py``), else
   skipped with the reason. Arm A is the stock script with the recipes accepted so far
   (and their launch environment), arm B is A plus the recipe; A and B run one process
   each a round, order alternating, until the speedup's interval decides or ``rounds``
   (or the recipe's share of the time budget) run out (``sequential.py``). B's loss
   trajectory is judged against A's by the same gates as the built-in path (``gate.judge``: at the arm's precision; the precision gate for
   BF16; bit-identical or within noise for the recipes that change no arithmetic). The
   gradients of a script are not read: loss trajectories decide. A recipe under which the
   script raises is rejected with the script's error; the job goes on. A script's dropout
   stays on: a recipe that draws other masks (``fused_dropout``) is judged by the
   random-stream gate on B's own run (its dropout sites observed on the first step) against
   the arm's spread with its random stream reseeded (one more run of A); ``torch_compile``,
   whose Inductor draws other masks too, is judged again on a run with eager's stream where
   its trajectory fails (the fused dropout's ops draw their seeds eagerly inside the op, so
   they keep their masks under compile).
4. **The ending** (:meth:`ScriptSearch.ending`): stock against all accepted recipes under
   the accepted environment; then, with ``Settings.headroom``, one more run of the
   optimized arm, its launch environment included, with ``headroom_steps`` steps after the
   warm-up under ``torch.profiler``, split by op family in the child (``arm.StepProfiler``).
   Its last step's model FLOPs by dtype (``arm.FlopStep``), with a stock warm-up step's,
   give MFU against the machine's peaks.

``job.py`` runs it and keeps the Run: the built-in path's ``OptimizeReport`` plus the code
edits that do the same by hand and the command that applies it (``profilednn apply``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import IO

import torch

from ...progress import Progress
from ...recipe_catalogue import THREADS
from ..abtest import Timing, in_children
from ..child_ab import faults_note
from ..final import FINAL_IN_CHILDREN, take_final_in_children
from ..flops import FlopCount, machine_peaks
from ..gate import Arm, Verdict, judge
from ..numerics import NumericsResult, PERTURBATION, calibrated, compare_trajectories
from ..precision_gate import precision_gate
from ..recipe_contract import Context, Recipe, Tolerance
from ..results import RecipeResult
from ..search import Ending, SearchState
from ..settings import Settings
from ..stream_gate import Site, stream_verdict, within_spread
from .checks import script_check
from .facts import ScriptFacts
from .runner import ArmError, ArmLayout, ArmOutput, ArmRunner, run_arm_process
from .runs import ScriptRuns, loss_trajectory, noise_of


LAYOUT_ROW = "layout"  # the recipes table's row of a ranks x threads layout (``_choose_layout``)

ScriptSettings = Settings.for_script
"""``Settings`` with a script's defaults (the name the script path had for them)."""


class ScriptSearch(ScriptRuns):
    """The search's :class:`~..search.Arms` for one script: runs its arms, each a child
    process (``runs.ScriptRuns``), and judges each recipe on them (see the module doc)."""

    def __init__(self, argv: list[str], settings: Settings, ctx: Context, say: Progress,
                 stdout: IO[str] | int | None = None, log: IO[str] | None = None,
                 runner: ArmRunner = run_arm_process, layouts: list[ArmLayout] | None = None) -> None:
        super().__init__(argv, settings, ctx, say, stdout, log, runner)
        self.layouts = list(layouts or [])  # other ranks x threads at the user's global batch, tried at the end
        self.chosen: ArmLayout | None = None  # the layout the search accepted (None: the user's)
        self.facts = ScriptFacts()
        self.rounding: NumericsResult | None = None
        # the warm-up of the arms that time a launch environment; start() shortens it to fit a short script
        self.env_warmup = max(settings.warmup, settings.env_warmup)
        self.notes: list[str] = []

    # -- the search ----------------------------------------------------------------------------
    def start(self, times_environment: bool = False) -> ArmOutput:
        """The stock arm (and fp32 rounding noise): what the script holds, its trajectory.
        With ``times_environment`` it runs the longer window of the launch-environment arms,
        and where the script trains fewer steps than that, their warm-up is shortened to fit
        (``env_warmup``; a note says so)."""
        longest = self.env_warmup if times_environment else self.settings.warmup
        count_at = (2 if longest >= 2 else 1) if self.settings.measure_flops else 0  # a warm-up step: untimed
        self.stock = self.arm([], {}, "stock", warmup=longest, at_least=self.settings.window, count_flops_at=count_at)
        done = len(self.stock.losses)
        self.env_warmup = max(self.settings.warmup, min(longest, done - self.settings.child_steps))
        if self.env_warmup < longest:
            self.notes.append(f"the script trains {done} steps: launch settings were timed after "
                              f"{self.env_warmup} warm-up steps, not {longest} (a memory setting may need more to "
                              "settle)")
        self.facts = ScriptFacts.from_dict(self.stock.facts)
        losses = self.stock.losses
        if not all(math.isfinite(x) for x in losses):
            seen = "no loss was backpropagated" if all(math.isnan(x) for x in losses) else f"losses {losses}"
            raise ArmError(f"the stock script's loss is not finite ({seen}): nothing to compare the recipes "
                           "against")
        if self.settings.calibrate_noise:
            perturbed = self.arm([], {}, "rounding noise", PERTURBATION)
            window = self.settings.window
            self.rounding = noise_of(loss_trajectory(self.stock, window), perturbed, window)
            self.unpaired = [self.stock, perturbed]  # the same arm twice (weights moved at rounding level)
        else:
            self.unpaired = [self.stock]  # paired with the first A/B's first run of the stock arm
        return self.stock

    def applies(self, recipe: Recipe, state: SearchState) -> str | None:
        """Whether ``recipe`` applies to the script, from what its stock arm saw (``checks.py``).
        Under ``--nproc-per-node`` the launch plan sets each rank's threads."""
        if self.settings.launched and recipe.name == THREADS:
            return ("under --nproc-per-node the launch plan sets each rank's threads (cores / ranks, or --threads); "
                    "with --batch-arg the other ranks x threads layouts are tried at the end, at the script's "
                    "global batch (`profilednn scale -- ...` studies them all)")
        return script_check(recipe, self.facts, self.ctx, state.env, state.names)

    def try_recipe(self, recipe: Recipe, state: SearchState) -> RecipeResult:
        """:meth:`applies`, then :meth:`trial` (skipped with the reason when it does not)."""
        reason = self.applies(recipe, state)
        if reason is not None:
            return RecipeResult(recipe.name, recipe.family, False, reason, decision=f"skipped: {reason}")
        return self.trial(recipe, state)

    def take(self, recipe: Recipe, state: SearchState) -> None:
        """Nothing to keep: the next arm is the script with ``state``'s recipes injected."""

    def trial(self, recipe: Recipe, state: SearchState) -> RecipeResult:
        """Arms A (the accepted recipes and environment) and B (A plus ``recipe``), interleaved;
        B's loss trajectory judged against A's."""
        test = state.budget.test(self.settings.rounds)
        runs = f"child processes (at most {test.max_rounds} per arm, one per arm a round, order alternating)"
        result = RecipeResult(recipe.name, recipe.family, True, "", measured_in=runs)
        env_b = dict(state.env)
        recipes_b = state.names
        if recipe.fresh_process:
            added, result.reason = recipe.launch_environment(self.ctx, state.env)
            result.env = {k: v for k, v in added.items() if state.env.get(k) != v}
            env_b.update(added)
        else:
            recipes_b.append(recipe.name)
        try:
            ab, out_a, out_b = self.ab((state.names, dict(state.env)), (recipes_b, env_b), recipe.name, test,
                                       warmup=self.env_warmup if recipe.fresh_process else None,
                                       b_options={"dropout_sites": True} if recipe.random_stream else None)
        except ArmError as exc:
            result.decision = f"rejected: the script failed under it: {exc}"
            result.reason = result.reason or str(exc)
            return result
        result.measured_in = in_children(len(ab.pairs))
        if not recipe.fresh_process:
            if recipe.name not in out_b.applied:
                result.decision = "rejected: the arm found nothing to change (no object it acts on was created)"
                return result
            result.reason = out_b.applied[recipe.name]
        result.first_step_ms = out_b.first_step_ms
        window = self.settings.window
        arm_a = Arm(loss_trajectory(out_a, window), state.precision)
        if recipe.random_stream:
            verdict = self._random_stream_verdict(recipe, arm_a, out_b, state)
        else:
            verdict = judge(recipe, arm_a, loss_trajectory(out_b, window), ctx=self.ctx, gate=self.gate,
                            rounding=self.rounding, calibration=self.calibration)
        if not verdict.numerics.passed and recipe.compiled_random and not recipe.random_stream:
            verdict = self._judged_with_eager_random(recipe, arm_a, recipes_b, env_b, verdict)
        every = f", each of the {len(out_b.rank_losses)} ranks' against its own" if out_b.rank_losses else ""
        result.tolerance = (f"{verdict.question} (loss trajectories over the window{every}; a script's gradients "
                            "are not read)")
        result.decide(verdict.numerics, ab, self.settings.min_speedup, "runs", gradients=False)
        state.budget.noise.add_repeats([a for a, _ in ab.pairs])  # A's back-to-back runs (never its first)
        faults = faults_note(out_a.faults_per_step, out_b.faults_per_step) if recipe.fresh_process else ""
        if faults:
            result.decision += f"; {faults}"
        return result

    def _random_stream_verdict(self, recipe: Recipe, arm_a: Arm, candidate: ArmOutput, state: SearchState) -> Verdict:
        """The random-stream gate on a script (``stream_gate.stream_verdict``): a script's
        dropout stays on, so the candidate's own run (its sites observed on the first step) is
        held against the arm within the arm's spread under another random stream (one more
        run of the arm, reseeded at the model's first call)."""
        gate = self.gate
        question = (f"random stream (a script's dropout stays on): every dropout site keeps 1-p and scales by "
                    f"1/(1-p) within {gate.stream_z:g} standard deviations, its backward uses its mask, and the "
                    f"loss trajectory is within {gate.factor:g} x the arm's spread with its random stream reseeded")
        try:
            other = self.reseeded(state.names, dict(state.env), recipe.name)
        except ArmError as exc:
            return Verdict(_not_checked(f"random stream not checked: the reseeded arm failed: {exc}",
                                        recipe.tolerance), question)
        window = self.settings.window
        sites = [Site.from_dict(d) for d in candidate.dropout_sites]
        result = stream_verdict(sites, arm_a.trajectory, loss_trajectory(other, window),
                                loss_trajectory(candidate, window),
                                recipe.tolerance, gate, "with its random stream reseeded at the model's first call")
        return Verdict(result, question)

    def _judged_with_eager_random(self, recipe: Recipe, arm_a: Arm, recipes: list[str], env: dict[str, str],
                                  failed: Verdict) -> Verdict:
        """``failed`` asked again of one more run of B whose compiled code draws its random
        numbers with eager's kernels: a script's dropout stays on, and the masks Inductor draws
        are not eager's, so B's timed runs differ from A by their masks as well as arithmetic."""
        try:
            out = self.arm(recipes, env, f"{recipe.name} numerics, eager's random stream",
                           options={"eager_random": True})
        except ArmError as exc:
            detail = f"{failed.numerics.detail}; the run with eager's random stream failed: {exc}"
            return Verdict(replace(failed.numerics, detail=detail), failed.question)
        again = judge(recipe, arm_a, loss_trajectory(out, self.settings.window), ctx=self.ctx,
                      gate=self.gate, rounding=self.rounding, calibration=self.calibration)
        detail = (f"with eager's random stream (torch._inductor.config.fallback_random: the arm's dropout masks): "
                  f"{again.numerics.detail}; with Inductor's own: {failed.numerics.detail}")
        return Verdict(replace(again.numerics, detail=detail),
                       f"{again.question}; judged with eager's random stream, since Inductor draws other masks")

    # -- the ending ----------------------------------------------------------------------------
    def ending(self, state: SearchState) -> Ending:
        """Stock against the accepted recipes and environment (child processes, A B A B),
        their numerics together, the headroom run, FLOPs and peaks."""
        assert self.stock is not None
        settings, notes = self.settings, list(self.notes)
        end = Ending(baseline=Timing(tuple(self.stock.times_ms or self.stock.step_ms[settings.warmup:])),
                     threads=int(self.stock.threads or 0), notes=notes,
                     rounding_noise=None if self.rounding is None else {
                         "loss_max_rel_diff": self.rounding.loss_max_rel_diff, "grad_rel_diff": None})
        if self.layouts:
            self._choose_layout(state)
        changed = bool(state.accepted or state.env or self.chosen)
        if changed:
            self._final(state, end)
        optimized_flops = None
        if settings.headroom and (end.final is not None or not changed):  # nothing won: stock's
            end.headroom, optimized_flops, why = self.headroom(state.names, dict(state.env),
                                                               self.env_warmup if state.env else settings.warmup,
                                                               self.chosen)
            if why:
                notes.append(why)
        end.flops = _flops_and_peaks(self.stock, optimized_flops, settings, changed, notes)
        if end.headroom is not None:
            end.headroom.weigh(end.flops.by_dtype_final, end.flops.peaks, "the optimized step's model FLOPs")
        longer = self.env_warmup + settings.child_steps
        ranks = settings.nproc_per_node * settings.nnodes
        nodes = f" over {settings.nnodes} nodes" if settings.nnodes > 1 else ""
        each = (f"a pinned launch of {ranks} ranks{nodes} (each step the slowest rank's; the ranks' parameters "
                "compared bit for bit at the end)" if settings.launched else "a fresh process")
        notes.insert(0, f"the script ran {self.runs} times, each {each} stopped after {settings.window} "
                        "optimizer steps "
                     + (f"({longer} where a launch environment was timed) " if longer > settings.window else "")
                     + "(Python, NumPy and torch seeded alike); whatever it writes (checkpoints, logs) it wrote "
                       "each time")
        return end

    def _choose_layout(self, state: SearchState) -> None:
        """Each other ranks x threads layout (the user's global batch kept) A/B'd against the
        best so far, both with the accepted recipes and environment; the faster by the same
        sequential test as a recipe is kept (a ``layout`` row among the recipes). Its losses
        are not compared step by step (each rank sees other samples); the global batch kept
        is what keeps the training the same (``ArmLayout.why_same``)."""
        for layout in self.layouts:
            current = self.chosen
            label, before = f"layout {layout.label}", current.label if current else "the launch given"
            self.say(f"{label}: against {before}, both with the accepted recipes")
            result = RecipeResult(LAYOUT_ROW, "distributed", True, f"{layout.label} instead of {before}",
                                  env=dict(state.env))
            try:
                ab, _, _ = self.ab((state.names, dict(state.env)), (state.names, dict(state.env)), label,
                                   state.budget.test(self.settings.rounds),
                                   warmup=self.env_warmup if state.env else None, a_layout=current, b_layout=layout)
            except ArmError as exc:
                result.decision = f"rejected: the script failed under it: {exc}"
                state.results.append(result)
                continue
            result.measured_in = in_children(len(ab.pairs))
            result.tolerance = layout.why_same
            result.take_timing(ab)
            result.take_verdict(True, layout.why_same, ab, self.settings.min_speedup, "runs")
            result.decision = result.decision.replace("; numerics pass", "; the global batch kept")
            result.numerics, result.numerics_detail = "not compared", layout.why_same
            if result.accepted:
                self.chosen = layout
            state.results.append(result)

    def _final(self, state: SearchState, end: Ending) -> None:
        """The final A/B (stock vs optimized; not with ``final_ab`` off, as for a built-in) and
        the accepted recipes' numerics together, into ``end``."""
        optimized: ArmOutput | None = None
        if self.settings.final_ab:
            self.say(FINAL_IN_CHILDREN)
            try:
                ab, stock_runs, optimized = self.ab(([], {}), (state.names, dict(state.env)), "final",
                                                    state.budget.test(self.settings.rounds, final=True),
                                                    warmup=self.env_warmup if state.env else None,
                                                    b_layout=self.chosen)
            except ArmError as exc:
                end.notes.append(f"the final A/B could not run: {exc}")
                return
            take_final_in_children(end, ab, stock_runs.faults_per_step, optimized.faults_per_step)
        if state.accepted:
            if optimized is None or self.chosen is not None:
                # no final A/B, or its ranks saw other samples than the user's: judged at the user's layout
                try:
                    label = "final numerics" + (", the script's own layout" if self.chosen else "")
                    optimized = self.arm(state.names, dict(state.env), label,
                                         warmup=self.env_warmup if state.env else None)
                except ArmError as exc:
                    end.notes.append(f"the accepted recipes' numerics together were not checked: {exc}")
                    return
            end.numerics = self.final_numerics(state.accepted, optimized, state.env)
            if not end.numerics.passed:
                end.notes.append(f"the accepted recipes together drift from stock: {end.numerics.detail}")

    def final_numerics(self, accepted: list[Recipe], optimized: ArmOutput, env: dict[str, str] | None = None
                       ) -> NumericsResult:
        """All accepted recipes together against stock, as the built-in path judges them;
        where that fails with a recipe that draws its own random numbers accepted, judged again
        on a run with eager's random stream (``env``: the accepted launch environment)."""
        if any(r.random_stream for r in accepted):
            return self._final_numerics_random_stream(accepted, optimized)
        result = self._final_numerics(accepted, optimized)
        if result.passed or not any(r.compiled_random for r in accepted):
            return result
        names = [r.name for r in accepted if not r.fresh_process]
        try:
            out = self.arm(names, dict(env or {}), "final numerics, eager's random stream",
                           options={"eager_random": True})
        except ArmError as exc:
            return replace(result, detail=f"{result.detail}; the run with eager's random stream failed: {exc}")
        again = self._final_numerics(accepted, out)
        return replace(again, detail=(f"with eager's random stream (the stock run's dropout masks): {again.detail}; "
                                      f"with Inductor's own: {result.detail}"))

    def _final_numerics_random_stream(self, accepted: list[Recipe], optimized: ArmOutput) -> NumericsResult:
        """With a recipe that draws other masks accepted: the optimized trajectory against
        stock's within max(stated, factor x stock's spread with its random stream reseeded)."""
        assert self.stock is not None
        window = self.settings.window
        stated = max(r.tolerance.loss_rtol for r in accepted)
        try:
            other = self.reseeded([], {}, "final numerics spread, stock")
        except ArmError as exc:
            return _not_checked(f"not checked: stock with its random stream reseeded failed: {exc}",
                                Tolerance(stated, math.inf))
        factor = self.gate.factor
        raw, allowed, spread = within_spread(loss_trajectory(self.stock, window), loss_trajectory(other, window),
                                             loss_trajectory(optimized, window), stated, factor)
        ok = math.isfinite(raw.loss_max_rel_diff) and raw.loss_max_rel_diff <= allowed
        detail = (f"{'trains as stock' if ok else 'trajectory outside the bound'} (random stream: masks differ by "
                  f"design): loss trajectory over {raw.steps} steps, max rel diff {raw.loss_max_rel_diff:.2e} "
                  f"(allowed {allowed:.2e} = max(stated {stated:g}, {factor:g} x stock's spread with its random "
                  f"stream reseeded {spread:.2e}))")
        return replace(raw, verdict="pass" if ok else "fail", detail=detail)

    def _final_numerics(self, accepted: list[Recipe], optimized: ArmOutput) -> NumericsResult:
        assert self.stock is not None
        candidate = loss_trajectory(optimized, self.settings.window)
        precise = [r.precision for r in accepted if r.precision]
        if precise:  # judged by the precision gate, its digits task with the precision recipes together
            return precision_gate(accepted, self.calibration(precise[0]), candidate, self.ctx, self.gate)
        tolerance = calibrated(max((r.tolerance for r in accepted), key=lambda t: t.loss_rtol), self.rounding,
                               self.settings.noise_factor)
        return compare_trajectories(loss_trajectory(self.stock, self.settings.window), candidate,
                                    Tolerance(tolerance.loss_rtol, math.inf))


def _not_checked(detail: str, tolerance: Tolerance) -> NumericsResult:
    """A failed verdict for a question that could not be asked (its run failed)."""
    return NumericsResult(verdict="fail", steps=0, loss_max_rel_diff=math.nan, grad_rel_diff=math.nan,
                          worst_param=None, worst_param_rel_diff=math.nan, detail=detail, tolerance=tolerance)


def _flops_and_peaks(stock: ArmOutput, optimized: dict[str, float] | None, settings: Settings,
                     changed: bool, notes: list[str]) -> FlopCount:
    """The stock and the optimized step's model FLOPs by dtype (counted in a warm-up step of
    the stock run and in the headroom run) and this machine's GEMM peaks, for MFU."""
    if not settings.measure_flops:
        return FlopCount()
    flops = stock.flops_by_dtype
    final = optimized if changed else flops  # nothing won: the optimized step is stock's
    if not flops:
        notes.append("no MFU: no matmul or convolution FLOPs were counted in the script's step")
        return FlopCount()
    if not final:
        notes.append("no MFU: the optimized step's FLOPs are counted in the headroom run, which did not run "
                     "(--no-headroom) or failed")
        return FlopCount()
    peaks, why = machine_peaks(stock.threads or torch.get_num_threads())
    if why:
        notes.append(why)
    return FlopCount(flops, final, peaks or None)


__all__ = ["ScriptSearch", "ScriptSettings"]
