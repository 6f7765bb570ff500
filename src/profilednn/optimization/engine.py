"""``optimize``: try each recipe, keep the ones that make the step faster without changing
the training, and say why for every one.

For each recipe in order:

1. ``check`` on the current best setup: does it apply? If not, the reason is recorded.
2. Build the candidate: a fresh clone of the caller's setup with the accepted recipes and
   this one applied (the caller's objects are never modified).
3. Numerics: the candidate's seeded loss trajectory and first-step gradients against the
   stock setup's (``numerics.py``), within the recipe's stated tolerance.
4. Speed: interleaved A/B of step time, current best vs candidate, in this process;
   process-level recipes (allocator, threads) in child processes started with and
   without their environment (``abtest.py``, ``child.py``).
5. Accept when numerics pass and the median step is at least ``min_speedup`` faster;
   accepted recipes compose: the next recipe is measured against them.

At the end the stock and the optimized setups are timed against each other once more,
interleaved, for the total speedup; model FLOPs per step (``FlopCounterMode`` over one
forward + backward) and the machine's measured GEMM peak give the model FLOP/s share.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import torch
from torch import nn

from ..errors import InputError, ProfileDNNError
from ..tables import OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES
from ..train_step import TrainStep
from .abtest import ABResult, Timing, from_samples, interleaved
from .estimates import fill_gains
from .flops import machine_peaks, step_flops_by_dtype
from .gate import Arm, FreshSetups, gate_steps, judge
from .numerics import (
    NumericsResult,
    Trajectory,
    calibrated,
    compare_trajectories,
    record_trajectory,
    rounding_noise,
)
from .headroom import Headroom, measure_headroom
from .precision_gate import Calibration, GateSettings, calibrate, judge_trajectory
from .recipes import Context, Recipe, Tolerance, select_recipes

if TYPE_CHECKING:
    from ..topology import CpuTopology

Progress = Callable[[str], None]


@dataclass
class Settings:
    """How hard ``optimize`` measures.

    ``numerics_steps``: seeded steps per numerics check; ``rounds``: interleaved A/B
    samples per arm; ``warmup``: untimed steps per arm before them; ``min_speedup``: the
    median speedup a recipe must reach to be kept; ``child_runs``: child processes per arm
    for process-level recipes (run A B B A ...), each timing ``child_steps`` steps;
    ``options``: recipe options (``compile_mode``). With ``calibrate_noise`` the stock
    setup is run once more with its weights perturbed at fp32 rounding level, and each
    recipe may drift up to ``noise_factor`` times that (or its stated tolerance, if larger).
    With ``headroom`` the optimized setup is profiled for ``headroom_steps`` steps at the end
    and split by op family (``headroom.py``).
    """

    numerics_steps: int = 3
    rounds: int = 5
    warmup: int = 1
    min_speedup: float = 1.02
    seed: int = 0
    child_runs: int = 2
    child_steps: int = 3
    child_timeout_s: float = 3600.0
    noise_factor: float = 5.0
    calibrate_noise: bool = True
    final_ab: bool = True
    measure_flops: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    precision_steps: int = 8
    digits_epochs: int = 6
    digits_target: float = 0.90
    headroom: bool = True
    headroom_steps: int = 3

    def gate(self) -> GateSettings:
        """The precision gate's settings (recipes that change the number format)."""
        return GateSettings(steps=max(self.precision_steps, self.numerics_steps), factor=self.noise_factor,
                            digits_epochs=self.digits_epochs, digits_target=self.digits_target, seed=self.seed)

    def check(self) -> None:
        if not self.noise_factor > 0:
            raise ProfileDNNError(f"noise_factor must be > 0, got {self.noise_factor}")
        if self.numerics_steps < 1 or self.rounds < 1 or self.warmup < 0:
            raise ProfileDNNError("numerics_steps and rounds must be >= 1, warmup >= 0")
        if self.child_runs < 1 or self.child_steps < 1:
            raise ProfileDNNError("child_runs and child_steps must be >= 1")
        if not self.min_speedup > 0:
            raise ProfileDNNError(f"min_speedup must be > 0, got {self.min_speedup}")
        if self.headroom_steps < 1:
            raise ProfileDNNError(f"headroom_steps must be >= 1, got {self.headroom_steps}")
        if self.precision_steps < 2 or self.digits_epochs < 1 or not 0.0 < self.digits_target <= 1.0:
            raise ProfileDNNError("precision_steps must be >= 2, digits_epochs >= 1, digits_target in (0, 1]")


@dataclass
class RecipeResult:
    """One recipe's outcome: applies or why not, how, its A/B and its numerics verdict."""

    recipe: str
    family: str
    applies: bool
    reason: str
    accepted: bool = False
    decision: str = ""
    measured_in: str | None = None
    before_ms: float | None = None
    after_ms: float | None = None
    before_spread: str | None = None
    after_spread: str | None = None
    speedup: float | None = None
    b_wins: float | None = None
    first_step_ms: float | None = None
    numerics: str = "not checked"
    loss_max_rel_diff: float | None = None
    grad_rel_diff: float | None = None
    worst_param: str | None = None
    worst_param_rel_diff: float | None = None
    numerics_detail: str | None = None
    tolerance: str | None = None
    estimated_gain_pct: float | None = None  # the profile's advice for it (``estimates.py``), if any
    measured_gain_pct: float | None = None  # step time it saved in its A/B, percent of the step before
    env: dict[str, str] = field(default_factory=dict)
    samples_before: list[float] = field(default_factory=list, repr=False)
    samples_after: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OptimizeReport:
    """What ``optimize`` tried and found (``table()`` for the per-recipe table)."""

    workload: str
    recipes: list[RecipeResult]
    accepted: list[str]
    environment: dict[str, str]
    baseline: Timing | None = None
    final: Timing | None = None
    flops_per_step: float | None = None
    gemm_peak_gflops: float | None = None
    flops_by_dtype: dict[str, float] | None = None  # the stock setup's model FLOPs per dtype
    flops_by_dtype_final: dict[str, float] | None = None  # the optimized setup's (BF16 after dtype_policy)
    peak_gflops_by_dtype: dict[str, float] | None = None
    threads: int = 1
    final_numerics: NumericsResult | None = None
    final_measured_in: str | None = None  # where the stock vs optimized total ran
    rounding_noise: dict[str, float] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    headroom: Headroom | None = None  # the optimized step by op family (Settings.headroom)

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or self.final is None:
            return None
        return self.baseline.median_ms / self.final.median_ms

    def _flops_share(self, timing: Timing | None, flops: dict[str, float] | None) -> float | None:
        from ..projection.dtypes import mfu

        if timing is None:
            return None
        if flops and self.peak_gflops_by_dtype:
            return mfu(flops, self.peak_gflops_by_dtype, timing.median_ms)
        if not self.flops_per_step or not self.gemm_peak_gflops:
            return None
        return self.flops_per_step / (timing.median_ms / 1000.0) / (self.gemm_peak_gflops * 1e9)

    @property
    def mfu_baseline(self) -> float | None:
        """Time the stock step's model FLOPs take at their dtypes' measured GEMM peaks over
        the step time (sum_d FLOPs_d / peak_d / step)."""
        return self._flops_share(self.baseline, self.flops_by_dtype)

    @property
    def mfu_final(self) -> float | None:
        """The same for the optimized step, with its own dtypes (BF16 FLOPs against the
        BF16 peak once ``dtype_policy`` is accepted)."""
        return self._flops_share(self.final, self.flops_by_dtype_final or self.flops_by_dtype)

    @property
    def headroom_at_peak(self) -> float | None:
        """The most any further change can still speed the optimized step up without
        cutting FLOPs or moving to a faster number format: the step run entirely at the
        measured GEMM peak (1 / ``mfu_final``). Near 1, the recipes have nothing left to
        win; a target above it needs fewer FLOPs or faster hardware, not another recipe."""
        mfu = self.mfu_final
        return None if not mfu else 1.0 / mfu

    def launch_prefix(self) -> str:
        """The environment to start training with (process-level recipes that won)."""
        return " ".join(f"{k}={v}" for k, v in self.environment.items())

    def table(self) -> pl.DataFrame:
        """One row per recipe (the ``optimize_recipes`` table of a Run)."""
        schema = OPTIMIZE_RECIPES.schema
        assert schema is not None
        columns = list(schema)
        rows = []
        for r in self.recipes:
            d = r.to_dict()
            row = {c: d[c] for c in columns}
            for c in ("loss_max_rel_diff", "grad_rel_diff", "worst_param_rel_diff", "speedup"):
                if row[c] is not None and not math.isfinite(row[c]):
                    row[c] = float("inf")
            rows.append(row)
        return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)

    def samples(self) -> pl.DataFrame:
        """Every timed sample: recipe (or ``total``), arm (before/after), index, ms."""
        rows = []
        for r in self.recipes:
            for arm, values in (("before", r.samples_before), ("after", r.samples_after)):
                rows += [(r.recipe, arm, i, v) for i, v in enumerate(values)]
        if self.baseline is not None and self.final is not None:
            for arm, t in (("before", self.baseline), ("after", self.final)):
                rows += [("total", arm, i, v) for i, v in enumerate(t.samples_ms)]
        return pl.DataFrame(rows, schema=OPTIMIZE_SAMPLES.schema, orient="row")

    def to_dict(self) -> dict[str, Any]:
        def timing(t: Timing | None) -> dict[str, Any] | None:
            if t is None:
                return None
            return {"median_ms": t.median_ms, "min_ms": t.min_ms, "max_ms": t.max_ms, "samples": len(t.samples_ms)}

        return {
            "workload": self.workload,
            "accepted": list(self.accepted),
            "environment": dict(self.environment),
            "launch_prefix": self.launch_prefix(),
            "baseline": timing(self.baseline),
            "final": timing(self.final),
            "speedup": self.speedup,
            "final_measured_in": self.final_measured_in,
            "flops_per_step": self.flops_per_step,
            "gemm_peak_gflops": self.gemm_peak_gflops,
            "flops_by_dtype": self.flops_by_dtype,
            "flops_by_dtype_final": self.flops_by_dtype_final,
            "peak_gflops_by_dtype": self.peak_gflops_by_dtype,
            "mfu_baseline": self.mfu_baseline,
            "mfu_final": self.mfu_final,
            "headroom_at_peak": self.headroom_at_peak,
            "headroom": None if self.headroom is None else self.headroom.to_dict(),
            "threads": self.threads,
            "final_numerics": None if self.final_numerics is None else {
                "verdict": self.final_numerics.verdict,
                "loss_max_rel_diff": self.final_numerics.loss_max_rel_diff,
                "grad_rel_diff": self.final_numerics.grad_rel_diff,
                "detail": self.final_numerics.detail,
            },
            "rounding_noise": self.rounding_noise,
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "recipes": [
                {k: v for k, v in r.to_dict().items() if k not in ("samples_before", "samples_after")}
                for r in self.recipes
            ],
        }


@dataclass
class OptimizeResult:
    """The optimized model, optimizer and loss (fresh objects, the caller's weights), the
    report, and the setup that ties them together (``setup.run()`` trains with the
    accepted input layout and autocast). Unpacks as ``model, optimizer, loss_fn, report``."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any, Any], torch.Tensor]
    report: OptimizeReport
    setup: TrainStep

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.optimizer, self.loss_fn, self.report))


# ----------------------------------------------------------------------------- building
def build(base: TrainStep, recipes: list[Recipe], ctx: Context) -> TrainStep:
    """A fresh clone of ``base`` with ``recipes`` applied in order."""
    setup = base.clone()
    for recipe in recipes:
        recipe.apply(setup, ctx)
        setup.applied.append(recipe.name)
    return setup


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()


def _numerics_fields(result: RecipeResult, num: NumericsResult) -> None:
    result.numerics = num.verdict
    result.loss_max_rel_diff = num.loss_max_rel_diff
    result.grad_rel_diff = num.grad_rel_diff
    result.worst_param = num.worst_param
    result.worst_param_rel_diff = num.worst_param_rel_diff
    result.numerics_detail = num.detail


def _timing_fields(result: RecipeResult, ab: ABResult) -> None:
    result.before_ms, result.after_ms = ab.before.median_ms, ab.after.median_ms
    result.before_spread, result.after_spread = ab.before.spread(), ab.after.spread()
    result.speedup, result.b_wins = ab.speedup, ab.b_wins
    result.samples_before, result.samples_after = list(ab.before.samples_ms), list(ab.after.samples_ms)


def _decide(result: RecipeResult, num: NumericsResult, ab: ABResult, min_speedup: float) -> None:
    fast = ab.speedup >= min_speedup
    result.accepted = num.passed and fast
    speed = (f"{ab.speedup:.3f}x ({ab.before.median_ms:.1f} -> {ab.after.median_ms:.1f} ms median, "
             f"faster in {ab.b_wins:.0%} of rounds)")
    if result.accepted:
        result.decision = f"accepted: {speed}; numerics pass"
    elif not num.passed:
        result.decision = f"rejected: numerics fail ({num.detail}); speed {speed}"
    else:
        verdict = "slower" if ab.speedup < 1.0 else f"below the {min_speedup:.2f}x needed"
        result.decision = f"rejected: {verdict}: {speed}; numerics pass"


# ----------------------------------------------------------------------------- evaluation
Calibrations = Callable[[str], Calibration]


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


def _evaluate_in_process(
    recipe: Recipe, base: TrainStep, accepted: list[Recipe], current: TrainStep, arm: Arm,
    rounding: NumericsResult | None, calibration: Calibrations, ctx: Context, settings: Settings, say: Progress,
    order: dict[str, int] | None = None,
) -> tuple[RecipeResult, TrainStep | None, Trajectory | None]:
    """Build base + accepted + ``recipe`` afresh, judge its seeded trajectory against the arm
    it would replace (``gate.py``), then time it against ``current`` interleaved."""
    result = RecipeResult(recipe.name, recipe.family, True, "", measured_in="this process")
    steps = gate_steps(recipe, arm, settings.numerics_steps, settings.gate())
    try:
        candidate, result.reason = build_with(base, accepted, recipe, ctx, order or {})
        say(f"{recipe.name}: numerics ({steps} seeded steps)")
        trajectory = record_trajectory(candidate, steps, settings.seed)
    except Exception as exc:  # any failure of a recipe is its verdict, reported in full
        result.decision = f"rejected: applying it failed: {_first_line(exc)}"
        result.reason = result.reason or _first_line(exc)
        return result, None, None
    result.first_step_ms = trajectory.first_step_ms
    if recipe.precision or arm.precision:
        say(f"{recipe.name}: {recipe.precision or arm.precision} gate")
    fresh = FreshSetups(lambda: build(base, accepted, ctx),
                        lambda: build_with(base, accepted, recipe, ctx, order or {})[0])
    verdict = judge(recipe, arm, trajectory, ctx=ctx, gate=settings.gate(), rounding=rounding,
                    calibration=calibration, fresh=fresh)
    result.tolerance = verdict.question
    _numerics_fields(result, verdict.numerics)
    say(f"{recipe.name}: interleaved A/B ({settings.rounds} rounds)")
    ab = interleaved(current.run, candidate.run, settings.rounds, settings.warmup)
    _timing_fields(result, ab)
    _decide(result, verdict.numerics, ab, settings.min_speedup)
    return result, candidate, trajectory


def _child_payload(base: TrainStep, accepted: list[Recipe], settings: Settings,
                   numerics_steps: int | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "recipes": list(accepted),
        "numerics_steps": numerics_steps or settings.numerics_steps,
        "seed": settings.seed,
        "warmup": settings.warmup,
        "steps": settings.child_steps,
        "threads": torch.get_num_threads(),
        "options": dict(settings.options),
    }
    rebuild = base.rebuild_args()
    if rebuild is not None:
        payload["workload"] = rebuild
    else:
        payload["setup"] = base
    return payload


def _run_child(payload_path: Path, env: dict[str, str], settings: Settings, label: str) -> dict[str, Any]:
    result_path = payload_path.with_name(f"result-{label}.pt")
    result_path.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "profilednn.optimization.child", str(payload_path), str(result_path)],
        env=env, capture_output=True, text=True, timeout=settings.child_timeout_s,
    )
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise ProfileDNNError(f"child process ({label}) exited with {proc.returncode}: {' | '.join(tail)}")
    return torch.load(result_path, weights_only=False)


def _evaluate_in_children(
    recipe: Recipe, base: TrainStep, accepted: list[Recipe], current: TrainStep, env: dict[str, str],
    arm: Arm, rounding: NumericsResult | None, calibration: Calibrations, ctx: Context, settings: Settings,
    say: Progress,
) -> RecipeResult:
    """A process-level recipe: arms A (the current setup, its environment) and B (A plus the
    recipe's environment) in child processes; B is judged against A's own trajectory."""
    result = RecipeResult(recipe.name, recipe.family, True, "",
                          measured_in=f"child processes ({settings.child_runs} per arm, interleaved)")
    probe = copy.copy(current)
    probe.env = dict(env)
    try:
        result.reason = recipe.apply(probe, ctx)
    except Exception as exc:  # reported as the recipe's verdict
        result.decision = f"rejected: applying it failed: {_first_line(exc)}"
        return result
    result.env = {k: v for k, v in probe.env.items() if env.get(k) != v}
    env_a = {**os.environ, **env}
    env_b = {**env_a, **probe.env}
    payload = _child_payload(base, accepted, settings, gate_steps(recipe, arm, settings.numerics_steps,
                                                                  settings.gate()))
    try:
        ab, first_a, first_b = _children_ab((payload, env_a), (payload, env_b), settings, say, recipe.name)
    except _ChildSetupError as exc:  # unpicklable user model: say so in the verdict
        result.decision = f"rejected: the setup cannot be passed to a child process: {exc}"
        return result
    except (ProfileDNNError, subprocess.TimeoutExpired) as exc:
        result.decision = f"rejected: {_first_line(exc)}"
        return result
    as_traj = lambda out: Trajectory(out["losses"], out["grads"], out["first_step_ms"])  # noqa: E731
    result.first_step_ms = first_b["first_step_ms"]
    verdict = judge(recipe, Arm(as_traj(first_a), arm.precision), as_traj(first_b), ctx=ctx, gate=settings.gate(),
                    rounding=rounding, calibration=calibration)
    result.tolerance = verdict.question
    _numerics_fields(result, verdict.numerics)
    _timing_fields(result, ab)
    _decide(result, verdict.numerics, ab, settings.min_speedup)
    return result


class _ChildSetupError(Exception):
    """The setup could not be written for a child process (the first line of why)."""


def _children_ab(
    arm_a: tuple[dict[str, Any], dict[str, str]], arm_b: tuple[dict[str, Any], dict[str, str]],
    settings: Settings, say: Progress, label: str,
) -> tuple[ABResult, dict[str, Any], dict[str, Any]]:
    """Arms A and B (each a child payload and its environment) in ``settings.child_runs``
    child processes each, run A B B A ...; the A/B of their step times and each arm's first
    output (its seeded losses and gradients)."""
    samples: dict[str, list[float]] = {"a": [], "b": []}
    medians: dict[str, list[float]] = {"a": [], "b": []}
    first: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="profilednn-optimize-") as tmp:
        paths = {"a": Path(tmp) / "payload-a.pt", "b": Path(tmp) / "payload-b.pt"}
        envs = {"a": arm_a[1], "b": arm_b[1]}
        try:
            torch.save(arm_a[0], paths["a"])
            torch.save(arm_b[0], paths["b"])
        except Exception as exc:
            raise _ChildSetupError(_first_line(exc)) from exc
        order = [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(settings.child_runs)]
        for i, pair in enumerate(order):
            for arm in pair:
                say(f"{label}: child process {arm.upper()} ({i + 1}/{settings.child_runs})")
                out = _run_child(paths[arm], envs[arm], settings, f"{arm}{i}")
                samples[arm] += list(out["times_ms"])
                medians[arm].append(Timing(tuple(out["times_ms"])).median_ms)
                first.setdefault(arm, out)
    return from_samples(samples["a"], samples["b"], medians["a"], medians["b"]), first["a"], first["b"]


# ----------------------------------------------------------------------------- the search
@dataclass
class _Search:
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


def _rejected_for_speed(result: RecipeResult) -> bool:
    return result.applies and not result.accepted and result.numerics == "pass" and result.speedup is not None


def _search(chosen: list[Recipe], base: TrainStep, arm: Arm, noise: NumericsResult | None,
            calibration: Calibrations, ctx: Context, settings: Settings, say: Progress) -> _Search:
    """Each recipe in turn (see the module doc); then a second pass over the in-process
    recipes rejected for speed alone once later recipes changed the arm: what BF16 makes of
    the step decides again (FrozenBatchNorm's fp32 affine costs little in fp32 and, under
    BF16 autocast, promotes every frozen activation back to fp32)."""
    order = {r.name: i for i, r in enumerate(chosen)}
    search = _Search([], {}, [], base.clone(), arm)
    tried_at: dict[int, int] = {}  # result index -> the arm's version it was tried against
    for recipe in chosen:
        say(f"{recipe.name}: does it apply?")
        reason = recipe.check(search.current, ctx)
        if reason is not None:
            search.results.append(RecipeResult(recipe.name, recipe.family, False, reason,
                                               decision=f"skipped: {reason}"))
            continue
        if recipe.fresh_process:
            result = _evaluate_in_children(recipe, base, search.accepted, search.current, search.env, search.arm,
                                           noise, calibration, ctx, settings, say)
            if result.accepted:
                search.env.update(result.env)
        else:
            result, candidate, trajectory = _evaluate_in_process(
                recipe, base, search.accepted, search.current, search.arm, noise, calibration, ctx, settings, say,
                order)
            if result.accepted and candidate is not None and trajectory is not None:
                search.accept(recipe, candidate, trajectory, order)
            elif _rejected_for_speed(result):
                tried_at[len(search.results)] = search.changes
        search.results.append(result)
    _second_pass(chosen, base, search, tried_at, order, noise, calibration, ctx, settings, say)
    return search


def _second_pass(chosen: list[Recipe], base: TrainStep, search: _Search, tried_at: dict[int, int],
                 order: dict[str, int], noise: NumericsResult | None, calibration: Calibrations, ctx: Context,
                 settings: Settings, say: Progress) -> None:
    by_name = {r.name: r for r in chosen}
    for index, version in tried_at.items():
        first = search.results[index]
        recipe = by_name[first.recipe]
        since = [r.name for r in search.accepted if order.get(r.name, 0) > order[recipe.name]]
        if search.changes == version or not since or recipe.check(search.current, ctx) is not None:
            continue
        say(f"{recipe.name}: second pass, after {', '.join(since)}")
        result, candidate, trajectory = _evaluate_in_process(
            recipe, base, search.accepted, search.current, search.arm, noise, calibration, ctx, settings, say, order)
        result.decision += (f" (second pass, after {', '.join(since)}; first pass {first.speedup:.3f}x"
                            f" against {first.before_ms:.1f} ms)")
        if result.accepted and candidate is not None and trajectory is not None:
            search.accept(recipe, candidate, trajectory, order)
        search.results[index] = result


# ----------------------------------------------------------------------------- FLOPs and peak
def step_flops(setup: TrainStep) -> float:
    """Model FLOPs of one training step (forward + backward) of a clone of ``setup``,
    counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    probe = setup.clone()
    inputs, targets = probe.next_batch()
    with FlopCounterMode(display=False) as counter:
        loss = probe.loss_fn(probe.forward(inputs), targets)
        loss.backward()
    return float(counter.get_total_flops())


def machine_peak(threads: int) -> tuple[float | None, str | None]:
    """This machine's measured fp32 GEMM peak (GFLOP/s) at ``threads``, or why not."""
    try:
        from ..projection.machine import get_machine
    except ImportError as exc:
        return None, f"no machine GEMM peak: {exc}"
    try:
        return float(get_machine().gemm_peak_gflops(dtype="fp32", threads=threads)), None
    except ProfileDNNError as exc:
        return None, f"no machine GEMM peak: {exc}"


def precision_peaks(chosen: list[Recipe], topo: CpuTopology) -> dict[str, float] | None:
    """This machine's GEMM peaks, fetched (measured once, then cached) only where a chosen
    recipe's dtype needs them to say whether it pays: a vector ISA for it, no matrix unit."""
    from ..topology import dtype_speed

    if not any(dtype_speed(r.precision, topo.isa).basis == "unmeasured" for r in chosen if r.precision):
        return None
    peaks, _ = machine_peaks(torch.get_num_threads())
    return peaks or None


# ----------------------------------------------------------------------------- entry points
def optimize_setup(
    base: TrainStep,
    recipes: list[str | Recipe] | str | None = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
    name: str | None = None,
) -> OptimizeResult:
    """Try ``recipes`` (all built-in ones by default) on ``base``; see the module docstring."""
    from ..topology import cpu_topology

    settings = settings or Settings()
    settings.check()
    say = progress or (lambda message: None)
    chosen = select_recipes(recipes)
    topo = cpu_topology()
    ctx = Context(topo, dict(settings.options), precision_peaks(chosen, topo))
    notes: list[str] = []

    say(f"stock: {settings.numerics_steps} seeded steps (the numerics reference)")
    current = base.clone()
    reference = record_trajectory(current, settings.numerics_steps, settings.seed)
    if not all(math.isfinite(x) for x in reference.losses):
        raise ProfileDNNError(f"the stock setup's loss is not finite ({reference.losses}): nothing to compare against")
    noise = None
    if settings.calibrate_noise:
        say("stock again with rounding-level weight noise (calibrates the numerics tolerance)")
        noise = rounding_noise(base.clone(), reference, settings.numerics_steps, settings.seed)
    calibrations: dict[str, Calibration] = {}

    def calibration(precision: str) -> Calibration:
        if precision not in calibrations:
            say(f"stock over {settings.gate().steps} steps, and with weights perturbed at {precision} "
                "resolution (the precision gate's noise floor)")
            calibrations[precision] = calibrate(base, precision, settings.gate())
        return calibrations[precision]

    search = _search(chosen, base, Arm(reference), noise, calibration, ctx, settings, say)
    accepted, env, results, current = search.accepted, search.env, search.results, search.current
    fill_gains(results)  # measured gain of each timed recipe; estimates come from a profile's advice

    final_numerics = None
    if accepted:
        say(f"final: numerics of all {len(accepted)} accepted recipes together")
        check = build(base, accepted, ctx)
        tolerance = calibrated(max((r.tolerance for r in accepted), key=lambda t: (t.loss_rtol, t.grad_rtol)),
                               noise, settings.noise_factor)
        precise = [r.precision for r in accepted if r.precision]
        if precise:  # BF16 in the mix: judged by its trajectory at its own resolution
            calib = calibration(precise[0])
            final_numerics, _ = judge_trajectory(
                calib, record_trajectory(check, len(calib.reference.losses), settings.seed),
                Tolerance(max(r.tolerance.loss_rtol for r in accepted), math.inf), settings.gate())
        else:
            final_numerics = compare_trajectories(
                reference, record_trajectory(check, settings.numerics_steps, settings.seed), tolerance)
        del check
        if not final_numerics.passed:
            notes.append(f"the accepted recipes together drift from stock: {final_numerics.detail}")
    final_setup = build(base, accepted, ctx)
    final_setup.env = dict(env)
    baseline_t = final_t = None
    final_in = None
    if settings.final_ab and env:
        # the launch environment only acts at process start: stock and optimized each in
        # child processes (stock under this process's environment), so the total includes it
        say("final: stock vs optimized (with its launch environment), in child processes")
        try:
            ab, _, _ = _children_ab((_child_payload(base, [], settings), dict(os.environ)),
                                 (_child_payload(base, accepted, settings), {**os.environ, **env}),
                                 settings, say, "final")
            baseline_t, final_t = ab.before, ab.after
            final_in = f"child processes ({settings.child_runs} per arm, interleaved; launch environment included)"
        except (_ChildSetupError, ProfileDNNError, subprocess.TimeoutExpired) as exc:
            notes.append(f"the final A/B could not run in child processes ({_first_line(exc)}); it ran in this "
                         "process, without the launch environment")
    if settings.final_ab and final_t is None:
        say("final: stock vs optimized, interleaved")
        stock = base.clone()
        ab = interleaved(stock.run, current.run, settings.rounds, settings.warmup + 1)
        baseline_t, final_t = ab.before, ab.after
        final_in = "this process, interleaved" + (" (launch environment not included)" if env else "")
        del stock
    flops = peak = by_dtype = by_dtype_final = peaks = None
    if settings.measure_flops:
        say("model FLOPs of one step, by compute dtype")
        by_dtype = step_flops_by_dtype(base)
        # a compiler changes no FLOPs, and a compiled setup cannot be cloned to count them
        uncompiled = [r for r in accepted if r.family != "compiler"]
        by_dtype_final = step_flops_by_dtype(build(base, uncompiled, ctx)) if accepted else dict(by_dtype)
        flops = sum(by_dtype.values())
        say("machine GEMM peaks (measured once, then cached)")
        peaks, why = machine_peaks(torch.get_num_threads())
        peak = peaks.get("fp32")
        if why:
            notes.append(why)
    headroom = None
    if settings.headroom:  # what holds the optimized step below the peak, by op family
        headroom, why = measure_headroom(current, settings.headroom_steps, by_dtype_final, peaks, say, env)
        notes += [why] if why else []
    if env:
        notes.append(
            "process-level settings were measured in child processes; start training with "
            + " ".join(f"{k}={v}" for k, v in env.items())
            + (" (the total above includes them)" if final_in and final_in.startswith("child")
               else " (the total above does not include them)")
        )
    report = OptimizeReport(
        workload=name or base.name or type(base.model).__name__,
        recipes=results,
        accepted=[r.name for r in accepted] + [r.recipe for r in results if r.accepted and r.env],
        environment=env,
        baseline=baseline_t,
        final=final_t,
        flops_per_step=flops,
        gemm_peak_gflops=peak,
        flops_by_dtype=by_dtype,
        flops_by_dtype_final=by_dtype_final,
        peak_gflops_by_dtype=peaks or None,
        threads=torch.get_num_threads(),
        final_numerics=final_numerics,
        final_measured_in=final_in,
        rounding_noise=None if noise is None else {"loss_max_rel_diff": noise.loss_max_rel_diff,
                                                    "grad_rel_diff": noise.grad_rel_diff},
        settings={k: v for k, v in asdict(settings).items()},
        notes=notes,
        headroom=headroom,
    )
    return OptimizeResult(final_setup.model, final_setup.optimizer, final_setup.loss_fn, report, final_setup)


def optimize(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    sample_batch: tuple[Any, Any],
    recipes: list[str | Recipe] | str | None = None,
    *,
    batches: list[tuple[Any, Any]] | None = None,
    data_loader: Any = None,
    settings: Settings | None = None,
    progress: Progress | None = None,
    **setting_overrides: Any,
) -> OptimizeResult:
    """Optimize a training setup on this CPU, proving each change by measurement.

    ``model``, ``optimizer`` (over the model's parameters) and ``loss_fn(outputs,
    targets)`` are used as given and never modified; ``sample_batch`` is one
    ``(inputs, targets)`` pair the steps train on (``batches`` several, cycled;
    ``data_loader`` a DataLoader instead). ``recipes``: names (``"a,b"`` or a list) or
    ``Recipe`` instances; None tries every built-in recipe. Keyword overrides set
    ``Settings`` fields (``rounds=``, ``numerics_steps=``, ``min_speedup=`` ...).

    Returns an ``OptimizeResult``: ``model, optimizer, loss_fn, report = optimize(...)``;
    its ``setup.run()`` trains with the accepted input layout and autocast.
    """
    if not isinstance(model, nn.Module):
        raise ProfileDNNError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ProfileDNNError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    model_params = {id(p) for p in model.parameters()}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in model_params]
    if foreign:
        raise ProfileDNNError(f"the optimizer holds {len(foreign)} tensors that are not parameters of the model")
    known = set(Settings.__dataclass_fields__)
    unknown = sorted(set(setting_overrides) - known)
    if unknown:
        raise InputError(f"optimize() does not take {', '.join(unknown)}; settings are: {', '.join(sorted(known))}")
    if settings is None:
        settings = Settings(**setting_overrides)
    elif setting_overrides:
        settings = Settings(**{**asdict(settings), **setting_overrides})
    base = TrainStep(model, optimizer, loss_fn, list(batches) if batches else [sample_batch],
                      data_loader=data_loader)
    return optimize_setup(base, recipes, settings, progress)


__all__ = [
    "OptimizeReport",
    "OptimizeResult",
    "RecipeResult",
    "Settings",
    "build",
    "machine_peak",
    "optimize",
    "optimize_setup",
    "step_flops",
]
