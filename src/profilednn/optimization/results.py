"""What ``optimize`` reports: one ``RecipeResult`` per recipe, the ``OptimizeReport`` over all
of them (its tables and JSON), and the ``OptimizeResult`` handed back to the caller."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl
import torch
from torch import nn

from ..tables import OPTIMIZE_RECIPES, OPTIMIZE_SAMPLES
from ..train_step import TrainStep
from .abtest import ABResult, Timing
from .headroom import Headroom
from .intervals import interval_columns, outcome_of
from .numerics import NumericsResult
from .sequential import bounds_text, log_ratios


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
    speedup_ci: list[float] | None = None  # [lo, hi]: the speedup's interval (``sequential.py``)
    rounds: int | None = None  # paired rounds its A/B ran before the test stopped
    env: dict[str, str] = field(default_factory=dict)
    samples_before: list[float] = field(default_factory=list, repr=False)
    samples_after: list[float] = field(default_factory=list, repr=False)
    paired_log_ratios: list[float] = field(default_factory=list, repr=False)  # its A/B's rounds, ln(A/B)

    def take_timing(self, ab: "ABResult") -> None:
        """Medians, spreads, speedup, win share and samples of its A/B."""
        self.before_ms, self.after_ms = ab.before.median_ms, ab.after.median_ms
        self.before_spread, self.after_spread = ab.before.spread(), ab.after.spread()
        self.speedup, self.b_wins = ab.speedup, ab.b_wins
        self.samples_before, self.samples_after = list(ab.before.samples_ms), list(ab.after.samples_ms)

    def decide(self, num: NumericsResult, ab: "ABResult", min_speedup: float, samples: str, *,
               gradients: bool = True) -> None:
        """Take the numerics verdict and the A/B, then accept or reject (:meth:`take_verdict`);
        ``gradients=False`` where only loss trajectories were compared (a script's arms)."""
        self.numerics = num.verdict
        self.loss_max_rel_diff = num.loss_max_rel_diff
        self.grad_rel_diff = num.grad_rel_diff if gradients else None
        if gradients:
            self.worst_param, self.worst_param_rel_diff = num.worst_param, num.worst_param_rel_diff
        self.numerics_detail = num.detail
        self.take_timing(ab)
        self.take_verdict(num.passed, num.detail, ab, min_speedup, samples)

    def take_verdict(self, numerics_passed: bool, numerics_detail: str, ab: "ABResult", min_speedup: float,
                     samples: str) -> None:
        """Accepted when the numerics pass and the speedup's interval lies above
        ``min_speedup``; rejected when the numerics fail or the interval lies below it;
        inconclusive otherwise (not accepted). The decision line says why (``samples``: what
        one round is, "rounds" or "runs")."""
        found = ab.interval
        self.speedup_ci = None if found is None else found.as_list()
        self.rounds = len(ab.pairs) or None
        self.paired_log_ratios = log_ratios(ab.pairs)
        figure = f"{ab.speedup:.3f}x" + ("" if found is None else f" [{bounds_text(found.lo, found.hi)}]")
        speed = (f"{figure} ({ab.before.median_ms:.1f} -> {ab.after.median_ms:.1f} ms median, "
                 f"{len(ab.pairs)} {samples}, faster in {ab.b_wins:.0%}"
                 + ("" if found is None or not found.scatter_text() else f"; {found.scatter_text()}") + ")")
        verdict = "undecided" if found is None else found.verdict(min_speedup)
        self.accepted = numerics_passed and verdict == "faster"
        if not numerics_passed:
            self.decision = f"rejected: numerics fail ({numerics_detail}); speed {speed}"
        elif self.accepted:
            self.decision = f"accepted: {speed}; numerics pass"
        elif verdict == "not faster":
            below = "slower" if found is not None and found.hi < 1.0 else f"below the {min_speedup:.2f}x needed"
            self.decision = f"rejected: {below}: {speed}; numerics pass"
        else:
            self.decision = (f"inconclusive: {speed}: the interval still straddles the {min_speedup:.2f}x needed; "
                             "more rounds (--rounds) or a longer --time-budget would decide it; numerics pass")

    @property
    def outcome(self) -> str:
        """accepted, rejected, inconclusive or skipped (the decision's first word)."""
        return outcome_of(self.decision)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outcome": self.outcome}


def recipes_table(results: Sequence[RecipeResult]) -> pl.DataFrame:
    """One row per recipe result (the ``optimize_recipes`` table of a Run); written after each
    recipe is decided too, so a stopped search keeps what it measured (``partial.py``)."""
    schema = OPTIMIZE_RECIPES.schema
    assert schema is not None
    columns = list(schema)
    rows = []
    for r in results:
        d = r.to_dict()
        d.update(interval_columns(d))
        row = {c: d[c] for c in columns}
        for c in ("loss_max_rel_diff", "grad_rel_diff", "worst_param_rel_diff", "speedup"):
            if row[c] is not None and not math.isfinite(row[c]):
                row[c] = float("inf")
        rows.append(row)
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


def samples_table(results: Sequence[RecipeResult], totals: tuple[Timing, Timing] | None = None) -> pl.DataFrame:
    """Every timed sample of ``results`` (and of the final stock/optimized ``totals``, as
    recipe ``total``): recipe, arm (before/after), index, ms."""
    rows = []
    for r in results:
        for arm, values in (("before", r.samples_before), ("after", r.samples_after)):
            rows += [(r.recipe, arm, i, v) for i, v in enumerate(values)]
    if totals is not None:
        for arm, t in zip(("before", "after"), totals):
            rows += [("total", arm, i, v) for i, v in enumerate(t.samples_ms)]
    return pl.DataFrame(rows, schema=OPTIMIZE_SAMPLES.schema, orient="row")


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
    edits: list[str] = field(default_factory=list)  # a script's: the code edits that do the same by hand
    speedup_ci: list[float] | None = None  # [lo, hi]: the total speedup's interval (``sequential.py``)
    total_speedup: float | None = None  # the total's paired estimate (its interval's point)
    a_vs_a: dict[str, Any] | None = None  # this machine's A-vs-A noise for the workload (``Noise.to_dict``)

    @property
    def speedup(self) -> float | None:
        """The total speedup: its paired rounds' estimate, else the ratio of the medians."""
        if self.baseline is None or self.final is None:
            return None
        return self.total_speedup or self.baseline.median_ms / self.final.median_ms

    def _flops_share(self, timing: Timing | None, flops: dict[str, float] | None) -> float | None:
        from ..hardware.dtypes import mfu

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
        return recipes_table(self.recipes)

    def samples(self) -> pl.DataFrame:
        """Every timed sample: recipe (or ``total``), arm (before/after), index, ms."""
        totals = None if self.baseline is None or self.final is None else (self.baseline, self.final)
        return samples_table(self.recipes, totals)

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
            "speedup_ci": self.speedup_ci,
            "a_vs_a": self.a_vs_a,
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
            "edits": list(self.edits),
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


__all__ = ["OptimizeReport", "OptimizeResult", "RecipeResult", "recipes_table", "samples_table"]
