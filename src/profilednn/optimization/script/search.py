"""``optimize -- python train.py``: the recipe search on the user's own, unmodified script.

The script is run many times, each time in a fresh child process (``arm.py``) that trains
for a window of ``warmup`` + ``steps`` optimizer steps and is then stopped:

1. **Stock**: once, to see what the script holds (root modules, optimizers, DataLoaders,
   its loss) and its seeded loss trajectory. A script that never steps its optimizer,
   ends early or whose loss is not finite stops the job here with a one-line reason (the
   Run is kept, ``failed``).
2. **Noise arms** (the numerics gate's calibration, as in the built-in path): the stock
   script with its weights perturbed at fp32 rounding level (``--no-calibrate``: skipped)
   and, once a BF16 question comes up, at BF16 resolution.
3. **Each recipe** in the built-in order: applies to the script (``checks.py``), else
   skipped with the reason. Arm A is the stock script with the recipes accepted so far
   (and their launch environment), arm B is A plus the recipe; A and B run ``rounds`` times
   each, interleaved A B A B. B's loss trajectory is judged against A's by the same gates
   as the built-in path (``gate.judge``: at the arm's precision; the precision gate for
   BF16; bit-identical or within noise for the recipes that change no arithmetic). The
   gradients of a script are not read: loss trajectories decide. A recipe under which the
   script raises is rejected with the script's error; the job goes on. A script's dropout
   stays on: a recipe that draws other masks (``fused_dropout``) is judged by the
   random-stream gate on B's own run (its dropout sites observed on the first step) against
   the arm's spread with its random stream reseeded (one more run of A); ``torch_compile``,
   whose Inductor draws other masks too, is judged again on a run with eager's stream where
   its trajectory fails (the fused dropout's ops draw their seeds eagerly inside the op, so
   they keep their masks under compile).
4. **Total**: stock against all accepted recipes under the accepted environment.
5. **Headroom** (``ScriptSettings.headroom``): one more run of the optimized arm, its
   launch environment included, with ``headroom_steps`` steps after the warm-up under
   ``torch.profiler``, split by op family in the child (``arm.StepProfiler``): the built-in
   path's ``optimize_headroom`` table. Its last step's model FLOPs by dtype
   (``arm.FlopStep``), with a stock warm-up step's, give MFU against the machine's peaks.

The outcome is the built-in path's ``OptimizeReport`` (the same ``optimize_recipes`` table,
``--json`` keys and report section), plus the code edits that do the same by hand and the
command that applies it (``profilednn apply RUN -- ...``).
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import polars as pl
import torch

from ...errors import InputError, ProfileDNNError
from ...run import Run, create_run
from ...tables import OPTIMIZE_HEADROOM, OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES, STEPS, steps_frame
from ..abtest import ABResult, Timing, from_samples
from ..flops import machine_peaks, precision_peaks
from ..headroom import Headroom
from ...hardware.dtypes import mfu
from ..results import OptimizeReport, RecipeResult
from ..estimates import fill_gains, profile_advice
from ..gate import Arm, Verdict, judge
from ..op_families import FAMILY_SCHEMA
from ..numerics import NumericsResult, PERTURBATION, Trajectory, calibrated, compare_trajectories
from ..child_ab import faults_note
from ..partial import OnResults, ResultLog
from ..precision_gate import NOISE_FLOOR_MIN, RESOLUTION, Calibration, GateSettings, judge_trajectory
from ..recipe_contract import Context, Recipe, Tolerance
from ..recipes import select_recipes
from ..search import rejected_for_speed
from ..settings import Settings
from ..stream_gate import Site, stream_verdict
from .checks import code_edits, script_check
from .facts import ScriptFacts
from .runner import ArmError, ArmOutput, run_arm_process

Progress = Callable[[str], None]


@dataclass
class ScriptSettings:
    """How hard the script search measures.

    ``warmup`` + ``steps``: the window each arm trains (``steps`` of them timed; the
    injected ``torch.compile`` compiles on the model's second call, so ``warmup`` >= 2 keeps
    compilation out of the timed steps);
    ``rounds``: child processes per arm, interleaved A B A B; ``min_speedup``: the median
    speedup a recipe must reach; ``calibrate_noise``: run the stock script with weights
    perturbed at fp32 rounding level, so a recipe may drift up to ``noise_factor`` times
    that; ``options``: recipe options (``compile_mode``); ``threads``: torch's threads in
    every arm (None: the script's own choice); ``env_warmup``: the warm-up of the arms of a
    launch-environment recipe (allocator, threads) and of the total, at least: huge pages
    and an allocator's caches settle over the first steps (the glibc allocator recipe timed
    after 2 steps made resnet50 0.89x, after 6 steps 1.10x).
    """

    warmup: int = 2
    steps: int = 5
    rounds: int = 2
    min_speedup: float = 1.02
    seed: int = 0
    noise_factor: float = 5.0
    calibrate_noise: bool = True
    digits_epochs: int = 6
    digits_target: float = 0.90
    child_timeout_s: float = 3600.0
    threads: int | None = None
    env_warmup: int = Settings.env_warmup  # one default for both paths
    options: dict[str, Any] = field(default_factory=dict)
    headroom: bool = Settings.headroom
    headroom_steps: int = Settings.headroom_steps
    measure_flops: bool = Settings.measure_flops

    @property
    def window(self) -> int:
        return self.warmup + self.steps

    def check(self) -> None:
        if self.warmup < 1:
            raise InputError(f"--warmup must be >= 1 for a script (its first step also runs the script's set-up), "
                             f"got {self.warmup}")
        if self.headroom_steps < 1:
            raise InputError(f"headroom_steps must be >= 1, got {self.headroom_steps}")
        if self.steps < 1 or self.rounds < 1:
            raise InputError(f"--steps and --rounds must be >= 1, got {self.steps} and {self.rounds}")
        if self.env_warmup < 0:
            raise InputError(f"--env-warmup must be >= 0, got {self.env_warmup}")
        if not self.min_speedup > 0 or not self.noise_factor > 0:
            raise InputError("min_speedup and noise_factor must be > 0")

    def gate(self) -> GateSettings:
        """The numerics gates judge the whole window's loss trajectory."""
        return GateSettings(steps=self.window, factor=self.noise_factor, digits_epochs=self.digits_epochs,
                            digits_target=self.digits_target, seed=self.seed)


def _trajectory(out: ArmOutput, steps: int | None = None) -> Trajectory:
    """The arm's loss trajectory (its first ``steps`` losses: every gate judges one window)."""
    return Trajectory(list(out.losses[:steps]), {}, out.first_step_ms or 0.0)


def _noise(reference: Trajectory, noisy: ArmOutput) -> NumericsResult:
    return compare_trajectories(reference, _trajectory(noisy), Tolerance(math.inf, math.inf))


@dataclass
class _State:
    """The search so far: accepted in-process recipes (by name, in order), the accepted
    launch environment, the arm's precision, one result per recipe."""

    accepted: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    precision: str | None = None
    results: list[RecipeResult] = field(default_factory=list)
    applied: dict[str, str] = field(default_factory=dict)


class ScriptSearch:
    """Runs the arms of one script and decides each recipe (see the module doc)."""

    def __init__(self, argv: list[str], settings: ScriptSettings, ctx: Context, say: Progress,
                 stdout: IO[str] | int | None = None, log: IO[str] | None = None) -> None:
        self.argv, self.settings, self.ctx, self.say, self.stdout = list(argv), settings, ctx, say, stdout
        self.log = log  # takes the script's stdout and stderr of every run, each after a header line
        self.runs = 0
        self.facts = ScriptFacts()
        self.stock: ArmOutput | None = None
        self.rounding: NumericsResult | None = None
        # the warm-up of the arms that time a launch environment; start() shortens it to fit a short script
        self.env_warmup = max(settings.warmup, settings.env_warmup)
        self.notes: list[str] = []
        self._calibrations: dict[str, Calibration] = {}

    # -- arms --------------------------------------------------------------------------------
    def arm(self, recipes: list[str], env: dict[str, str], label: str, perturb: float | None = None,
            warmup: int | None = None, at_least: int | None = None,
            options: dict[str, Any] | None = None, profile_steps: int = 0, count_flops_at: int = 0) -> ArmOutput:
        """One run of the script; ``options`` are added to the settings' recipe options. With
        ``profile_steps`` the steps after the warm-up are that many, under the profiler; with
        ``count_flops_at`` that step's model FLOPs are counted (``arm.FlopStep``)."""
        self.runs += 1
        warmup = self.settings.warmup if warmup is None else warmup
        steps = profile_steps + 1 if profile_steps else self.settings.steps  # + 1: the last region's close
        self.say(f"{label}: the script, {warmup + steps} steps (run {self.runs})")
        spec = {"argv": self.argv, "recipes": list(recipes), "options": {**self.settings.options, **(options or {})},
                "seed": self.settings.seed, "warmup": warmup, "steps": steps, "profile_steps": profile_steps,
                "count_flops_at": count_flops_at, "perturb": perturb, "threads": self.settings.threads}
        stdout, stderr = self.stdout, None
        if self.log is not None:  # both streams into the log, after the run's header
            self.log.write(f"==> run {self.runs}: {label} ({warmup + steps} steps)"
                           + (f" under {' '.join(f'{k}={v}' for k, v in env.items())}" if env else "") + "\n")
            self.log.flush()
            stdout, stderr = self.log, subprocess.STDOUT
        return run_arm_process(spec, env, timeout_s=self.settings.child_timeout_s, stdout=stdout, stderr=stderr,
                               at_least=at_least)

    def ab(self, a: tuple[list[str], dict[str, str]], b: tuple[list[str], dict[str, str]],
           label: str, warmup: int | None = None, b_options: dict[str, Any] | None = None
           ) -> tuple[ABResult, ArmOutput, ArmOutput]:
        """Arms A and B, ``rounds`` child processes each, A B A B, each after ``warmup``
        untimed steps (default: the settings'); B's failure propagates. ``b_options``: more
        recipe options for B's runs."""
        samples: dict[str, list[float]] = {"a": [], "b": []}
        medians: dict[str, list[float]] = {"a": [], "b": []}
        faults: dict[str, list[int]] = {"a": [], "b": []}
        first: dict[str, ArmOutput] = {}
        for i in range(self.settings.rounds):
            for key, (recipes, env) in (("a", a), ("b", b)):
                out = self.arm(recipes, env, f"{label} {key.upper()} {i + 1}/{self.settings.rounds}",
                               warmup=warmup, options=b_options if key == "b" else None)
                samples[key] += out.times_ms
                faults[key] += out.faults_per_step
                medians[key].append(Timing(tuple(out.times_ms)).median_ms)
                first.setdefault(key, out)
        for key, out in first.items():  # each arm's first output carries every run's fault counts
            out.faults_per_step = faults[key]
        return from_samples(samples["a"], samples["b"], medians["a"], medians["b"]), first["a"], first["b"]

    def calibration(self, precision: str) -> Calibration:
        """Stock's trajectory and its drift with weights perturbed at ``precision``'s resolution."""
        if precision not in self._calibrations:
            assert self.stock is not None
            reference = _trajectory(self.stock, self.settings.window)
            noisy = self.arm([], {}, f"noise floor at {precision} resolution", perturb=RESOLUTION[precision])
            self._calibrations[precision] = Calibration(precision, reference, _noise(reference, noisy))
        return self._calibrations[precision]

    def headroom(self, recipes: list[str], env: dict[str, str], warmup: int
                 ) -> tuple[Headroom | None, dict[str, float] | None, str | None]:
        """One more run of the arm ``recipes`` + ``env``: ``headroom_steps`` steps after
        ``warmup`` under torch.profiler, split by op family (``StepProfiler`` in the arm),
        then one step's model FLOPs by dtype (``FlopStep``). Returns (headroom, flops, None)
        or (None, None, why there is none)."""
        steps = self.settings.headroom_steps
        try:
            out = self.arm(recipes, env, f"headroom: {steps} steps under torch.profiler (time by op family)",
                           warmup=warmup, profile_steps=steps,
                           count_flops_at=warmup + steps + 1 if self.settings.measure_flops else 0)
        except ArmError as exc:
            return None, None, f"no headroom split: the profiled run failed ({exc})"
        if not out.headroom:
            return None, None, "no headroom split: the profiled run returned no profiled steps"
        split = out.headroom
        families = pl.DataFrame(split["families"], schema=FAMILY_SCHEMA)
        headroom = Headroom(families, int(split["steps"]), float(split["step_ms"]))
        headroom.notes += [
            f"ms per step under torch.profiler ({headroom.step_ms:.1f} ms a step there), mean of {headroom.steps} "
            "steps, each from its first module call to the next step's (its data loading, forward, backward and "
            "update); each event's self time counts once",
            "profiled in a child process of the script" + (" with the launch environment" if env else ""),
        ]
        return headroom, out.flops_by_dtype, None

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
        self.env_warmup = max(self.settings.warmup, min(longest, done - self.settings.steps))
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
            self.rounding = _noise(_trajectory(self.stock, self.settings.window),
                                   self.arm([], {}, "rounding noise", PERTURBATION))
        return self.stock

    def try_recipe(self, recipe: Recipe, state: _State) -> RecipeResult:
        reason = script_check(recipe, self.facts, self.ctx, state.env, state.accepted)
        if reason is not None:
            return RecipeResult(recipe.name, recipe.family, False, reason, decision=f"skipped: {reason}")
        runs = f"child processes ({self.settings.rounds} per arm, interleaved A B A B)"
        result = RecipeResult(recipe.name, recipe.family, True, "", measured_in=runs)
        env_b = dict(state.env)
        recipes_b = list(state.accepted)
        if recipe.fresh_process:
            probe = SimpleNamespace(env=dict(state.env))
            result.reason = recipe.apply(probe, self.ctx)  # type: ignore[arg-type]  # writes .env only
            result.env = {k: v for k, v in probe.env.items() if state.env.get(k) != v}
            env_b.update(probe.env)
        else:
            recipes_b.append(recipe.name)
        try:
            ab, out_a, out_b = self.ab((list(state.accepted), dict(state.env)), (recipes_b, env_b), recipe.name,
                                       warmup=self.env_warmup if recipe.fresh_process else None,
                                       b_options={"dropout_sites": True} if recipe.random_stream else None)
        except ArmError as exc:
            result.decision = f"rejected: the script failed under it: {exc}"
            result.reason = result.reason or str(exc)
            return result
        if not recipe.fresh_process:
            if recipe.name not in out_b.applied:
                result.decision = "rejected: the arm found nothing to change (no object it acts on was created)"
                return result
            result.reason = out_b.applied[recipe.name]
        result.first_step_ms = out_b.first_step_ms
        window = self.settings.window
        arm_a = Arm(_trajectory(out_a, window), state.precision)
        if recipe.random_stream:
            verdict = self._random_stream_verdict(recipe, arm_a, out_b, state)
        else:
            verdict = judge(recipe, arm_a, _trajectory(out_b, window), ctx=self.ctx, gate=self.settings.gate(),
                            rounding=self.rounding, calibration=self.calibration)
        if not verdict.numerics.passed and recipe.compiled_random and not recipe.random_stream:
            verdict = self._judged_with_eager_random(recipe, arm_a, recipes_b, env_b, verdict)
        result.tolerance = verdict.question + " (loss trajectories over the window; a script's gradients are not read)"
        _numerics(result, verdict.numerics)
        result.take_timing(ab)
        _decide(result, verdict.numerics, ab, self.settings.min_speedup)
        faults = faults_note(out_a.faults_per_step, out_b.faults_per_step) if recipe.fresh_process else ""
        if faults:
            result.decision += f"; {faults}"
        if result.accepted and not recipe.fresh_process:
            state.applied[recipe.name] = result.reason
        return result

    def _reseeded(self, recipes: list[str], env: dict[str, str], label: str) -> ArmOutput:
        """The arm ``recipes`` under another random stream: torch reseeded at the model's first call."""
        return self.arm(recipes, env, f"{label}: random stream reseeded", options={"reseed": True})

    def _random_stream_verdict(self, recipe: Recipe, arm_a: Arm, candidate: ArmOutput, state: _State) -> Verdict:
        """The random-stream gate on a script (``stream_gate.stream_verdict``): a script's
        dropout stays on, so the candidate's own run (its sites observed on the first step) is
        held against the arm within the arm's spread under another random stream (one more
        run of the arm, reseeded at the model's first call)."""
        gate = self.settings.gate()
        question = (f"random stream (a script's dropout stays on): every dropout site keeps 1-p and scales by "
                    f"1/(1-p) within {gate.stream_z:g} standard deviations, its backward uses its mask, and the "
                    f"loss trajectory is within {gate.factor:g} x the arm's spread with its random stream reseeded")
        try:
            other = self._reseeded(list(state.accepted), dict(state.env), recipe.name)
        except ArmError as exc:
            return Verdict(_not_checked(f"random stream not checked: the reseeded arm failed: {exc}",
                                        recipe.tolerance), question)
        window = self.settings.window
        sites = [Site.from_dict(d) for d in candidate.dropout_sites]
        result = stream_verdict(sites, arm_a.trajectory, _trajectory(other, window), _trajectory(candidate, window),
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
        again = judge(recipe, arm_a, _trajectory(out, self.settings.window), ctx=self.ctx,
                      gate=self.settings.gate(), rounding=self.rounding, calibration=self.calibration)
        detail = (f"with eager's random stream (torch._inductor.config.fallback_random: the arm's dropout masks): "
                  f"{again.numerics.detail}; with Inductor's own: {failed.numerics.detail}")
        return Verdict(replace(again.numerics, detail=detail),
                       f"{again.question}; judged with eager's random stream, since Inductor draws other masks")

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
            other = self._reseeded([], {}, "final numerics spread, stock")
        except ArmError as exc:
            return _not_checked(f"not checked: stock with its random stream reseeded failed: {exc}",
                                Tolerance(stated, math.inf))
        stock = _trajectory(self.stock, window)
        spread = compare_trajectories(stock, _trajectory(other, window), Tolerance(math.inf, math.inf))
        factor = self.settings.gate().factor
        allowed = max(stated, factor * max(spread.loss_max_rel_diff, NOISE_FLOOR_MIN))
        raw = compare_trajectories(stock, _trajectory(optimized, window), Tolerance(allowed, math.inf))
        ok = math.isfinite(raw.loss_max_rel_diff) and raw.loss_max_rel_diff <= allowed
        detail = (f"{'trains as stock' if ok else 'trajectory outside the bound'} (random stream: masks differ by "
                  f"design): loss trajectory over {raw.steps} steps, max rel diff {raw.loss_max_rel_diff:.2e} "
                  f"(allowed {allowed:.2e} = max(stated {stated:g}, {factor:g} x stock's spread with its random "
                  f"stream reseeded {spread.loss_max_rel_diff:.2e}))")
        return replace(raw, verdict="pass" if ok else "fail", detail=detail)

    def _final_numerics(self, accepted: list[Recipe], optimized: ArmOutput) -> NumericsResult:
        assert self.stock is not None
        candidate = _trajectory(optimized, self.settings.window)
        precise = [r.precision for r in accepted if r.precision]
        if precise:
            result, _ = judge_trajectory(self.calibration(precise[0]), candidate,
                                         Tolerance(max(r.tolerance.loss_rtol for r in accepted), math.inf),
                                         self.settings.gate())
            return result
        tolerance = calibrated(max((r.tolerance for r in accepted), key=lambda t: t.loss_rtol), self.rounding,
                               self.settings.noise_factor)
        return compare_trajectories(_trajectory(self.stock), candidate, Tolerance(tolerance.loss_rtol, math.inf))


def _not_checked(detail: str, tolerance: Tolerance) -> NumericsResult:
    """A failed verdict for a question that could not be asked (its run failed)."""
    return NumericsResult(verdict="fail", steps=0, loss_max_rel_diff=math.nan, grad_rel_diff=math.nan,
                          worst_param=None, worst_param_rel_diff=math.nan, detail=detail, tolerance=tolerance)


def _numerics(result: RecipeResult, num: NumericsResult) -> None:
    result.numerics = num.verdict
    result.loss_max_rel_diff = num.loss_max_rel_diff
    result.grad_rel_diff = None
    result.numerics_detail = num.detail


def _decide(result: RecipeResult, num: NumericsResult, ab: ABResult, min_speedup: float) -> None:
    """Accepted when the numerics pass and the median step is ``min_speedup`` faster (the
    built-in path's rule and wording)."""
    result.take_verdict(num.passed, num.detail, ab, min_speedup, "runs")


def _take(recipe: Recipe, result: RecipeResult, state: _State) -> None:
    """Compose an accepted recipe into the arm the next one is measured against."""
    if not result.accepted:
        return
    if recipe.fresh_process:
        state.env.update(result.env)
    else:
        state.accepted.append(recipe.name)
        state.precision = recipe.precision or state.precision


def _passes(search: ScriptSearch, chosen: list[Recipe], on_results: OnResults | None = None) -> _State:
    """Each recipe in turn against the arm so far, then the second pass; ``on_results`` hears
    the results so far after each decision."""
    state = _State()
    kept = on_results or (lambda results: None)
    tried_at: dict[int, int] = {}  # result index -> how many in-process recipes its arm had
    for recipe in chosen:
        search.say(f"{recipe.name}: does it apply?")
        result = search.try_recipe(recipe, state)
        if not recipe.fresh_process and rejected_for_speed(result):
            tried_at[len(state.results)] = len(state.accepted)
        state.results.append(result)
        _take(recipe, result, state)
        kept(state.results)
    _second_pass(search, [r.name for r in chosen], {r.name: r for r in chosen}, state, tried_at, kept)
    return state


def _second_pass(search: ScriptSearch, order: list[str], by_name: dict[str, Recipe], state: _State,
                 tried_at: dict[int, int], kept: OnResults) -> None:
    """In-process recipes rejected for speed alone, tried once more where recipes after them
    in the order were accepted since (the built-in path's second pass, ``..search``): under
    BF16 or a compiled model the same change can pay where it did not in fp32."""
    for index, seen in tried_at.items():
        first = state.results[index]
        since = [n for n in state.accepted[seen:] if order.index(n) > order.index(first.recipe)]
        if not since:
            continue
        search.say(f"{first.recipe}: second pass, after {', '.join(since)}")
        result = search.try_recipe(by_name[first.recipe], state)
        result.decision += (f" (second pass, after {', '.join(since)}; first pass {first.speedup:.3f}x"
                            f" against {first.before_ms:.1f} ms)")
        state.results[index] = result
        kept(state.results)
        if result.accepted:  # keep the recipes' order: the injector acts in its own fixed order anyway
            state.accepted.append(first.recipe)
            state.accepted.sort(key=order.index)
            state.precision = by_name[first.recipe].precision or state.precision


def _flops_and_peaks(stock: ArmOutput, optimized: dict[str, float] | None, settings: ScriptSettings,
                     changed: bool, notes: list[str]) -> tuple[dict[str, float] | None, dict[str, float] | None,
                                                               dict[str, float] | None]:
    """The stock and the optimized step's model FLOPs by dtype (counted in a warm-up step of
    the stock run and in the headroom run) and this machine's GEMM peaks, for MFU."""
    if not settings.measure_flops:
        return None, None, None
    flops = stock.flops_by_dtype
    final = optimized if changed else flops  # nothing won: the optimized step is stock's
    if not flops:
        notes.append("no MFU: no matmul or convolution FLOPs were counted in the script's step")
        return None, None, None
    if not final:
        notes.append("no MFU: the optimized step's FLOPs are counted in the headroom run, which did not run "
                     "(--no-headroom) or failed")
        return None, None, None
    peaks, why = machine_peaks(stock.threads or torch.get_num_threads())
    if why:
        notes.append(why)
    return flops, final, peaks or None


def search_script(argv: list[str], recipes: list[str | Recipe] | str | None, settings: ScriptSettings,
                  say: Progress, stdout: IO[str] | int | None = None,
                  on_results: OnResults | None = None, log: IO[str] | None = None
                  ) -> tuple[OptimizeReport, dict[str, Any]]:
    """The whole search (module doc); the report and the ``script`` block of the Run's
    manifest (argv, injected recipes with what each did, environment, code edits).
    ``on_results`` hears the recipe results so far each time one is decided."""
    from ...topology import cpu_topology

    chosen = select_recipes(recipes)
    topo = cpu_topology()
    ctx = Context(topo, dict(settings.options), precision_peaks(chosen, topo))
    search = ScriptSearch(argv, settings, ctx, say, stdout, log)
    stock = search.start(times_environment=any(r.fresh_process for r in chosen))
    by_name = {r.name: r for r in chosen}
    state = _passes(search, chosen, on_results)
    longer = search.env_warmup + settings.steps
    notes = [f"the script ran {{runs}} times, each a fresh process stopped after {settings.window} optimizer steps "
             + (f"({longer} where a launch environment was timed) " if longer > settings.window else "")
             + "(Python, NumPy and torch seeded alike); whatever it writes (checkpoints, logs) it wrote each time",
             *search.notes]
    baseline, final, final_numerics = Timing(tuple(stock.times_ms or stock.step_ms[settings.warmup:])), None, None
    final_in = None
    accepted = [by_name[n] for n in state.accepted]
    if state.accepted or state.env:
        say("final: stock vs optimized (with its launch environment), in child processes")
        try:
            ab, stock_runs, optimized = search.ab(([], {}), (list(state.accepted), dict(state.env)), "final",
                                         warmup=search.env_warmup if state.env else None)
            baseline, final = ab.before, ab.after
            faults = faults_note(stock_runs.faults_per_step, optimized.faults_per_step)
            if faults:
                notes.append(f"final A/B, A stock and B optimized: {faults}")
            final_in = (f"child processes ({settings.rounds} per arm, interleaved A B A B; launch environment "
                        "included)")
            if accepted:
                final_numerics = search.final_numerics(accepted, optimized, state.env)
                if not final_numerics.passed:
                    notes.append(f"the accepted recipes together drift from stock: {final_numerics.detail}")
        except ArmError as exc:
            notes.append(f"the final A/B could not run: {exc}")
    headroom, optimized_flops = None, None
    if settings.headroom and (final is not None or not (state.accepted or state.env)):  # nothing won: stock's
        headroom, optimized_flops, why = search.headroom(list(state.accepted), dict(state.env),
                                        search.env_warmup if state.env else settings.warmup)
        if why:
            notes.append(why)
    flops, flops_final, peaks = _flops_and_peaks(stock, optimized_flops, settings,
                                                 bool(state.accepted or state.env), notes)
    if headroom is not None:
        if flops_final and peaks:
            headroom.gemm_efficiency = mfu(flops_final, peaks, headroom.gemm_ms)
        else:
            headroom.notes.append("no GEMM efficiency: the optimized step's model FLOPs or the machine's GEMM "
                                  "peaks were not measured")
    notes[0] = notes[0].replace("{runs}", str(search.runs))
    if state.env:
        notes.append("process-level settings were measured in child processes; start training with "
                     + " ".join(f"{k}={v}" for k, v in state.env.items()) + " (the total above includes them)")
    names = [*state.accepted, *[r.recipe for r in state.results if r.accepted and r.env]]
    report = OptimizeReport(
        workload=" ".join(argv), recipes=state.results, accepted=names, environment=dict(state.env),
        baseline=baseline, final=final, threads=int(stock.threads or 0), final_numerics=final_numerics,
        final_measured_in=final_in,
        rounding_noise=None if search.rounding is None else {
            "loss_max_rel_diff": search.rounding.loss_max_rel_diff, "grad_rel_diff": None},
        settings=asdict(settings), notes=notes, headroom=headroom,
        flops_per_step=sum(flops.values()) if flops else None, flops_by_dtype=flops,
        flops_by_dtype_final=flops_final, peak_gflops_by_dtype=peaks,
        gemm_peak_gflops=(peaks or {}).get("fp32"),
    )
    edits = code_edits(state.accepted, search.facts)
    if state.env:
        edits.append("launch with: " + report.launch_prefix() + " " + " ".join(argv))
    script = {"argv": list(argv), "recipes": list(state.accepted), "applied": dict(state.applied),
              "environment": dict(state.env), "edits": edits, "facts": search.facts.to_dict(), "runs": search.runs}
    return report, script


def _open_log(path: Path) -> IO[str]:
    try:
        return path.open("a", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the script log {path}: {exc.strerror or exc}") from None


def optimize_script(
    argv: list[str],
    runs_dir: Path | str = "runs",
    recipes: list[str | Recipe] | str | None = None,
    *,
    settings: ScriptSettings | None = None,
    progress: Progress | None = None,
    command: list[str] | None = None,
    profile: Path | str | None = None,
    stdout: IO[str] | int | None = None,
    script_log: Path | str | None = None,
) -> tuple[Run, OptimizeReport]:
    """Optimize the user's script ``argv`` (``python train.py ARGS`` or ``python -m pkg``)
    and keep the outcome as a Run (``optimize_recipes``, ``optimize_samples``, ``steps``,
    ``manifest["optimize"]`` with the code edits, ``manifest["script"]`` for ``apply``).
    ``profile``: a profile Run of the same script whose advice gives each recipe's
    estimated gain. ``stdout``: where the script's output goes (default: stderr);
    ``script_log``: a file that takes the script's stdout and stderr of every run instead,
    each run headed by a ``==> run N: ...`` line (appended to, created if missing)."""
    from ...capture.fingerprint import fingerprint
    from ...capture.runners import script_target

    path, module, _ = script_target(argv)  # a missing script is a one-line error, before any Run
    settings = settings or ScriptSettings()
    settings.check()
    advice = profile_advice(profile) if profile is not None else None
    say = progress or (lambda message: None)
    label = f"optimize-{path.stem if path else module}"
    log = _open_log(Path(script_log)) if script_log is not None else None  # a bad path fails before any Run
    with contextlib.ExitStack() as stack:
        if log is not None:
            stack.callback(log.close)
        run = stack.enter_context(create_run(
            runs_dir, label=label, command=command, fingerprint=fingerprint(), kind="optimize",
            workload={"kind": "script", "name": str(path or module), "argv": list(argv)}))
        try:
            report, script = search_script(argv, recipes, settings, say, sys.stderr if stdout is None else stdout,
                                           ResultLog(run, recipes), log)
        except ArmError as exc:
            run.set_status("failed", error=str(exc))
            raise type(exc)(f"{exc} (Run kept as failed: {run.path})") from None
        fill_gains(report.recipes, advice)
        run.write_table(OPTIMIZE_RECIPES, report.table())
        run.write_table(OPTIMIZE_SAMPLES, report.samples())
        if report.headroom is not None:
            run.write_table(OPTIMIZE_HEADROOM, report.headroom.table())
        if report.final is not None:
            run.write_table(STEPS, steps_frame([{"step": i, "time_ms": t}
                                                for i, t in enumerate(report.final.samples_ms)]))
        run.set_status("complete", optimize={**report.to_dict(), "edits": script["edits"]}, script=script,
                       steps=len(report.final.samples_ms) if report.final else 0, notes=list(report.notes))
    return run, report


__all__ = ["ScriptSearch", "ScriptSettings", "optimize_script", "search_script"]
